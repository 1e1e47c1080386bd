// Bundle reading and validation: the C++ twin of runtime/bundle.py.
#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <openssl/evp.h>
#include <unistd.h>

#include "sdqes/runtime.hpp"
#include "sdqes/saved_files.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sdqes {
namespace {

std::string reexport_hint(const fs::path& root) {
  return "re-export it (sdqes-edge export ... --out " + root.string() + ")";
}

// What sdqes_edge/bundle_manifest.schema.json requires, top level and one level down; tests/test_contract.py
// removes each key the schema requires from a manifest and checks this runtime refuses it.
const char* const kManifestRequired[] = {"format", "format_version", "model", "preprocess", "image_size",
                                         "embed_dim", "batch", "fps", "state", "graphs", "tokenizer",
                                         "thresholds", "files", "tool_versions"};
const char* const kGraphsRequired[] = {"step", "text"};
const char* const kTokenizerRequired[] = {"file", "context_length"};

const json& require(const json& object, const char* key, const fs::path& manifest) {
  if (!object.is_object() || !object.contains(key)) {
    throw Error(manifest.string() + " is malformed: missing '" + key + "'; " +
                reexport_hint(manifest.parent_path()));
  }
  return object.at(key);
}

// One field of a protobuf message on the wire: varint key, then a varint, 8 or 4 bytes, or a length and as many.
constexpr int kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5;
constexpr uint64_t kModelMetadataProps = 14;  // ModelProto.metadata_props: StringStringEntryProto {key 1, value 2}

uint64_t read_varint(std::istream& in, const fs::path& graph) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const int byte = in.get();
    if (byte == std::char_traits<char>::eof()) throw Error(graph.string() + " is not an ONNX graph (cut short)");
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (byte < 0x80) return value;
  }
  throw Error(graph.string() + " is not an ONNX graph (a varint runs on)");
}

// The key and value of a StringStringEntryProto held in ``bytes``.
std::pair<std::string, std::string> string_entry(const std::string& bytes, const fs::path& graph) {
  std::istringstream in(bytes);
  std::string fields[3];
  while (in.peek() != std::char_traits<char>::eof()) {
    const uint64_t key = read_varint(in, graph);
    if ((key & 7) != kLength) throw Error(graph.string() + " is not an ONNX graph (a metadata entry is malformed)");
    const uint64_t size = read_varint(in, graph);
    std::string value(size, '\0');
    if (!in.read(value.data(), static_cast<std::streamsize>(size))) {
      throw Error(graph.string() + " is not an ONNX graph (a metadata entry runs past its end)");
    }
    if ((key >> 3) == 1 || (key >> 3) == 2) fields[key >> 3] = value;
  }
  return {fields[1], fields[2]};
}

}  // namespace

std::map<std::string, std::string> metadata_props(const fs::path& graph) {
  std::ifstream in(graph, std::ios::binary);
  if (!in) throw Error("cannot read " + graph.string());
  const std::streamoff end = static_cast<std::streamoff>(fs::file_size(graph));
  std::map<std::string, std::string> props;
  while (in.tellg() < end) {
    const uint64_t key = read_varint(in, graph);
    const int wire = static_cast<int>(key & 7);
    if (wire == kVarint) {
      read_varint(in, graph);
    } else if (wire == kFixed64 || wire == kFixed32) {
      const std::streamoff width = wire == kFixed64 ? 8 : 4;
      if (width > end - in.tellg()) throw Error(graph.string() + " is not an ONNX graph (cut short)");
      in.seekg(width, std::ios::cur);
    } else if (wire == kLength) {
      const uint64_t size = read_varint(in, graph);
      if (size > static_cast<uint64_t>(end - in.tellg())) {
        throw Error(graph.string() + " is not an ONNX graph (a field runs past the end of the file)");
      }
      if ((key >> 3) == kModelMetadataProps) {
        std::string bytes(size, '\0');
        in.read(bytes.data(), static_cast<std::streamsize>(size));
        props.insert(string_entry(bytes, graph));
      } else {
        in.seekg(static_cast<std::streamoff>(size), std::ios::cur);  // the graph itself: its weights never read
      }
    } else {
      throw Error(graph.string() + " is not an ONNX graph (wire type " + std::to_string(wire) + ")");
    }
    if (!in) throw Error(graph.string() + " is not an ONNX graph (cut short)");
  }
  return props;
}

int64_t StateTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string sha256_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    EVP_DigestUpdate(ctx, buffer.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  std::ostringstream hex;
  for (unsigned int i = 0; i < length; ++i) hex << std::hex << std::setw(2) << std::setfill('0') << int(digest[i]);
  return hex.str();
}

fs::path inside_bundle(const fs::path& root, const std::string& name, bool named_by_manifest) {
  // Refused as written (absolute, any "..", a backslash), before the file system is touched; what remains is
  // resolved with symlinks followed and must still lie under the resolved bundle directory.
  const fs::path pure(name);
  bool outside = name.empty() || pure.is_absolute() || pure.has_root_name() || name.find('\\') != std::string::npos;
  for (const auto& part : pure) outside = outside || part == "..";
  if (!outside) {
    const fs::path base = fs::weakly_canonical(root);
    const fs::path relative = fs::weakly_canonical(root / pure).lexically_relative(base);
    outside = relative.empty() || *relative.begin() == "..";
  }
  const std::string trust =
      "nothing outside a bundle is read: get the bundle again from a source you trust or re-export it";
  if (outside && !named_by_manifest) {
    throw Error((root / pure).string() + " leads outside the bundle through a symlink; " + trust);
  }
  if (outside) {
    throw Error("manifest.json of " + root.string() + " names '" + name +
                "', which lies outside the bundle (absolute, '..' or a symlink leading out); " + trust);
  }
  return root / pure;
}

std::vector<StateTensor> parse_state_spec(const json& items) {
  std::vector<StateTensor> out;
  for (const json& item : items) {
    StateTensor t;
    t.name = item.at("name").get<std::string>();
    t.shape = item.at("shape").get<std::vector<int64_t>>();
    t.dtype = item.at("dtype").get<std::string>();
    t.initial_value = item.at("initial_value").get<float>();
    if (t.dtype != "float32") throw Error("state tensor " + t.name + " has dtype " + t.dtype + "; expected float32");
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::string> Bundle::precisions() const {
  std::vector<std::string> out;
  for (const char* p : {"fp32", "fp16", "int8"}) {
    if (manifest["graphs"]["step"].contains(p)) out.emplace_back(p);
  }
  return out;
}

std::string model_identity(const Bundle& bundle) {
  const json& step = bundle.manifest["graphs"]["step"];
  if (!step.contains("fp32")) return "";
  return bundle.manifest["files"][step["fp32"]["file"].get<std::string>()].value("sha256", std::string());
}

fs::path Bundle::step_graph(const std::string& precision) const {
  const json& step = manifest["graphs"]["step"];
  if (!step.contains(precision)) {
    throw Error(root.string() + " has no " + precision + " step graph; re-export with --precision " + precision);
  }
  return inside_bundle(root, step[precision]["file"].get<std::string>());
}

namespace {

// The manifest carries no hash, and this runtime builds the frame, the batch and the normalization from it: each
// field a step graph's own description (its metadata, hashed with the graph) fixes must agree with it. As
// runtime/bundle.py _check_against_graphs words it.
void check_against_graphs(const Bundle& b) {
  for (auto& [precision, entry] : b.manifest.at("graphs").at("step").items()) {
    const std::string file = entry.at("file").get<std::string>();
    const auto props = metadata_props(b.root / file);  // confined and hashed above
    const auto found = props.find(kMetadataKey);
    if (found == props.end()) continue;
    const json description = json::parse(found->second, nullptr, /*allow_exceptions=*/false);
    if (!description.is_object()) continue;  // not one of ours: the Python runtime names it when it opens it
    for (const char* key : kDescribedByTheGraph) {
      if (!description.contains(key)) continue;
      const json& exported = description.at(key);
      const json said = b.manifest.contains(key) ? b.manifest.at(key) : json();
      if (exported == said) continue;
      const std::string what = exported.is_object()
          ? std::string("another ") + key + " than " + file + " was exported with"
          : std::string(key) + " " + said.dump() + ", but " + file + " was exported with " + exported.dump();
      throw Error("manifest.json of " + b.root.string() + " says " + what +
                  ": the manifest was edited or damaged after export; restore it, or " + reexport_hint(b.root));
    }
  }
}

}  // namespace

void parse_thresholds(const json& thresholds, Bundle& b) {
  // As the manifest's schema has them: each threshold a probability in (0, 1) (the default in [0, 1]).
  const auto probability = [](const json& value, const std::string& where, bool open) {
    const double t = value.get<double>();
    if (!(open ? (t > 0.0 && t < 1.0) : (t >= 0.0 && t <= 1.0))) {
      throw Error("thresholds/" + where + ": " + value.dump() + " is not a probability in (0, 1)");
    }
    return t;
  };
  b.default_threshold = probability(thresholds.at("default"), "default", false);
  b.label_thresholds.clear();
  const json per_label = thresholds.value("per_label", json::object());  // a local: items() refers to it
  for (const auto& [label, value] : per_label.items()) {
    b.label_thresholds[label] = probability(value, "per_label/" + label, true);
  }
  const json policy = thresholds.value("policy", json());
  b.exit_margin = policy.is_null() ? 0.0 : policy.at("exit_margin").get<double>();
  b.cooldown_s = policy.is_null() ? 0.0 : policy.at("cooldown_s").get<double>();
  if (!(b.exit_margin >= 0.0 && b.cooldown_s >= 0.0)) {
    throw Error("thresholds/policy: " + policy.dump() + " holds a negative exit margin or cooldown");
  }
}

Bundle load_bundle(const fs::path& root, bool verify_hashes) {
  check_path_form(root, "bundle");
  // A service's user given what root keeps: it was told the bundle "does not exist" or "has no manifest.json".
  std::error_code looked;  // a folder must be read and entered; a file given as one is named as such below
  const std::string unreadable = unreadable_problem(root, fs::is_directory(root, looked) ? R_OK | X_OK : F_OK);
  if (!unreadable.empty()) {
    throw Error("bundle " + root.string() + " " + unreadable +
                "; give the folder `sdqes-edge export --out` wrote, the one holding manifest.json");
  }
  if (!fs::is_directory(root)) {  // worded as the Python loader words it (runtime/bundle.py)
    if (!fs::exists(root)) {
      throw Error("bundle " + root.string() + " does not exist; make one with `sdqes-edge export --out " +
                  root.string() + "`");
    }
    const std::string kind = fs::is_regular_file(root) ? "file" : "special file (a pipe or a device)";
    throw Error("bundle " + root.string() + " is a " + kind +
                ", not a folder; give the folder `sdqes-edge export --out` wrote, the one holding manifest.json");
  }
  const fs::path manifest_path = inside_bundle(root, "manifest.json", false);
  if (!fs::is_regular_file(manifest_path)) {
    throw Error(root.string() + " has no manifest.json, so it is not a finished bundle; " + reexport_hint(root));
  }
  Bundle b;
  b.root = root;
  try {
    std::ifstream in(manifest_path);
    b.manifest = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(manifest_path.string() + " is not valid JSON (" + std::string(e.what()) + "); " + reexport_hint(root));
  }
  const json& m = b.manifest;
  try {
    if (require(m, "format", manifest_path).get<std::string>() != kBundleFormat) {
      throw Error(manifest_path.string() + " is not an sdqes-edge bundle manifest; " + reexport_hint(root));
    }
    const int version = require(m, "format_version", manifest_path).get<int>();
    if (version > kBundleFormatVersion) {
      throw Error(root.string() + " uses bundle format " + std::to_string(version) +
                  ", newer than this runtime reads (" + std::to_string(kBundleFormatVersion) +
                  "); upgrade sdqes-edge");
    }
    b.image_size = require(m, "image_size", manifest_path).get<int>();
    b.embed_dim = require(m, "embed_dim", manifest_path).get<int>();
    b.batch = require(m, "batch", manifest_path).get<int>();
    b.fps = require(m, "fps", manifest_path).get<double>();
    if (!(b.fps > 0.0 && b.fps <= kMaxFps)) {  // the schema's bounds: the manifest's fps is the user's to edit
      std::ostringstream words;
      words << manifest_path.string() << " is malformed at fps: " << b.fps << " is not a rate in (0, " << kMaxFps
            << "] frames per second; set it there, or " << reexport_hint(root);
      throw Error(words.str());
    }
    const json& thresholds = require(m, "thresholds", manifest_path);
    try {
      parse_thresholds(thresholds, b);
    } catch (const Error& e) {  // the manifest named, as a malformed one is
      throw Error(manifest_path.string() + " is malformed at " + e.what() + "; " + reexport_hint(root));
    }
    const json& pre = require(m, "preprocess", manifest_path);
    for (int c = 0; c < 3; ++c) {
      b.preprocess.mean[c] = pre.at("mean").at(c).get<double>();
      b.preprocess.std[c] = pre.at("std").at(c).get<double>();
    }
    b.preprocess.resize_shorter_side = pre.value("resize_shorter_side", true);
    b.preprocess.center_crop = pre.value("center_crop", true);
    b.state = parse_state_spec(require(m, "state", manifest_path));
    for (const char* key : kManifestRequired) require(m, key, manifest_path);
    for (const char* key : kGraphsRequired) require(m.at("graphs"), key, manifest_path);
    for (const char* key : kTokenizerRequired) require(m.at("tokenizer"), key, manifest_path);
    for (const auto& [precision, entry] : m.at("graphs").at("step").items()) {
      for (const char* key : {"file", "inputs", "outputs"}) require(entry, key, manifest_path);
    }
  } catch (const json::exception& e) {
    throw Error(manifest_path.string() + " is malformed (" + std::string(e.what()) + "); " + reexport_hint(root));
  }
  // Nothing outside the bundle is named; every file the manifest uses is listed with a hash, and every listed
  // file exists (and matches).
  for (auto& [name, entry] : m["files"].items()) inside_bundle(root, name);
  for (auto& [precision, entry] : m["graphs"]["step"].items()) {
    const std::string file = entry.at("file").get<std::string>();
    inside_bundle(root, file);
    if (!m["files"].contains(file)) {
      throw Error("manifest.json of " + root.string() + " uses " + file + " but lists no sha256 for it; " +
                  reexport_hint(root));
    }
  }
  for (auto& [name, entry] : m["files"].items()) {
    const fs::path path = root / name;  // confined above
    if (!fs::is_regular_file(path)) throw Error(path.string() + " is missing from the bundle; " + reexport_hint(root));
    if (verify_hashes && sha256_file(path) != entry.at("sha256").get<std::string>()) {
      throw Error(path.string() + " does not match the sha256 in manifest.json (corrupted or changed after export); " +
                  reexport_hint(root));
    }
  }
  // State wiring: every step graph takes and gives exactly the spec's tensors, in its order.
  for (auto& [precision, entry] : m["graphs"]["step"].items()) {
    std::vector<std::string> ins, outs;
    for (const json& n : entry.at("inputs")) {
      const auto s = n.get<std::string>();
      if (s.rfind(kStateInputPrefix, 0) == 0) ins.push_back(s);
    }
    for (const json& n : entry.at("outputs")) {
      const auto s = n.get<std::string>();
      if (s.rfind(kStateOutputPrefix, 0) == 0) outs.push_back(s);
    }
    bool same = ins.size() == b.state.size() && outs.size() == b.state.size();
    for (size_t i = 0; same && i < b.state.size(); ++i) {
      same = ins[i] == b.state[i].input_name() && outs[i] == b.state[i].output_name();
    }
    if (!same) {
      throw Error("the " + precision + " step graph's state inputs/outputs disagree with the state spec in "
                  "manifest.json; " + reexport_hint(root));
    }
  }
  check_against_graphs(b);
  return b;
}

fs::path find_engine(const Bundle& bundle, const std::string& precision, const std::string& device_folder) {
  const fs::path engines = inside_bundle(bundle.root, "engines", false);
  const std::string file = "step." + precision + ".engine";
  if (!device_folder.empty()) {
    const fs::path path = inside_bundle(bundle.root, "engines/" + device_folder + "/" + file, false);
    if (fs::is_regular_file(path)) return path;
  } else if (fs::is_directory(engines)) {
    for (const auto& dir : fs::directory_iterator(engines)) {
      const fs::path path =
          inside_bundle(bundle.root, "engines/" + dir.path().filename().string() + "/" + file, false);
      if (fs::is_regular_file(path)) return path;
    }
  }
  throw Error(bundle.root.string() + " has no " + precision + " TensorRT engine" +
              (device_folder.empty() ? "" : " for " + device_folder) +
              "; build one on the device: sdqes-edge build-engine " + bundle.root.string() + " --precision " +
              precision);
}

namespace {

// "10.3.0.26" -> "10.3.0": the Python bindings report three or four parts depending on the platform.
std::string release_of(const std::string& version) {
  size_t dots = 0, end = 0;
  while (end < version.size() && !(version[end] == '.' && ++dots == 3)) ++end;
  return version.substr(0, end);
}

// An engine built from a step graph that is not this bundle's (an engines folder copied in from another export of
// the model) would run the other model's weights, silently: the sidecar records the sha256 of the graph it was built
// from, the manifest lists each of the bundle's files' sha256.
void check_engine_source(const Bundle& bundle, const json& sidecar, const std::string& precision) {
  const json built_from = sidecar.value("source_graph_sha256", json());
  if (!built_from.is_string()) return;  // a sidecar that records none (hand-made): nothing to compare
  const json source = sidecar.value("source_graph", json());
  std::string listed;
  if (source.is_string() && bundle.manifest["files"].contains(source.get<std::string>())) {
    listed = bundle.manifest["files"][source.get<std::string>()].value("sha256", std::string());
  }
  if (built_from.get<std::string>() != listed) {
    throw Error("the " + precision + " engine in " + bundle.root.string() + " was built from a " +
                (source.is_string() ? source.get<std::string>() : std::string("step graph")) +
                " that is not this bundle's (an engines folder copied from another export?); rebuild it here: "
                "sdqes-edge build-engine " + bundle.root.string() + " --precision " + precision);
  }
}

}  // namespace

fs::path find_engine(const Bundle& bundle, const std::string& precision, const EngineTarget& target) {
  const fs::path engines = inside_bundle(bundle.root, "engines", false);
  const std::string file = "step." + precision + ".engine";
  const std::string wanted = "sm" + std::to_string(target.cc_major) + std::to_string(target.cc_minor) +
                             " with TensorRT " + release_of(target.tensorrt_version);
  std::vector<std::string> seen;  // what the bundle has: "<folder> (smXY, TensorRT v)"
  if (fs::is_directory(engines)) {
    std::vector<fs::path> folders;
    for (const auto& dir : fs::directory_iterator(engines)) folders.push_back(dir.path().filename());
    std::sort(folders.begin(), folders.end());  // the same answer whatever order the file system lists
    for (const auto& folder : folders) {
      const fs::path path = inside_bundle(bundle.root, "engines/" + folder.string() + "/" + file, false);
      if (!fs::is_regular_file(path)) continue;
      const fs::path sidecar_path = inside_bundle(
          bundle.root, "engines/" + folder.string() + "/" + fs::path(file).replace_extension(".json").string(), false);
      json sidecar;
      try {
        std::ifstream in(sidecar_path);
        sidecar = json::parse(in);
      } catch (const std::exception&) {
        seen.push_back(folder.string() + " (no readable sidecar)");
        continue;
      }
      const json cc = sidecar.value("compute_capability", json::array());
      const std::string built = sidecar.value("tensorrt_version", std::string());
      if (!cc.is_array() || cc.size() != 2 || !cc[0].is_number_integer() || !cc[1].is_number_integer()) {
        seen.push_back(folder.string() + " (sidecar without a compute capability)");
        continue;
      }
      if (cc[0].get<int>() == target.cc_major && cc[1].get<int>() == target.cc_minor &&
          release_of(built) == release_of(target.tensorrt_version)) {
        check_engine_source(bundle, sidecar, precision);
        return path;
      }
      seen.push_back(folder.string() + " (sm" + std::to_string(cc[0].get<int>()) + std::to_string(cc[1].get<int>()) +
                     ", TensorRT " + built + ")");
    }
  }
  std::string has;
  for (const auto& s : seen) has += (has.empty() ? "" : ", ") + s;
  throw Error(bundle.root.string() + " has no " + precision + " TensorRT engine for " + wanted +
              (has.empty() ? "" : " (it has: " + has + ")") + "; build one on this device: sdqes-edge build-engine " +
              bundle.root.string() + " --precision " + precision);
}

}  // namespace sdqes
