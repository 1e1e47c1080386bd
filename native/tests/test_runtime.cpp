// The native runtime reproduces the Python runtime on vectors the Python side wrote (tests/vectors/).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <regex>
#include <sstream>

#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "sdqes/live_reader.hpp"
#include "sdqes/runtime.hpp"
#include "sdqes/sdqes.h"
#include "vectors.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

using sdqes_test::kVectors;
using sdqes_test::read_json;

namespace {

std::vector<float> read_f32(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

fs::path copy_bundle(const std::string& name) {
  const fs::path target = fs::temp_directory_path() / ("sdqes-native-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(target);
  fs::copy(kVectors / "bundle", target, fs::copy_options::recursive);
  return target;
}

// The message of the sdqes::Error that `call` throws ("" when it throws none).
std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const sdqes::Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const fs::path& bundle) {
  return message_of([&] { sdqes::load_bundle(bundle); });
}

}  // namespace

TEST(Preprocess, MatchesThePythonRuntimeWithin1e6) {
  for (const json& c : read_json(kVectors / "preprocess.json")) {
    const cv::Mat image = cv::imread((kVectors / c["image"].get<std::string>()).string(), cv::IMREAD_COLOR);
    ASSERT_FALSE(image.empty()) << c["image"];
    sdqes::Preprocess p;
    for (int i = 0; i < 3; ++i) {
      p.mean[i] = c["mean"][i].get<double>();
      p.std[i] = c["std"][i].get<double>();
    }
    const auto got = sdqes::preprocess(image, c["image_size"].get<int>(), p);
    const auto expected = read_f32(kVectors / c["expected"].get<std::string>());
    ASSERT_EQ(got.size(), expected.size()) << c["image"];
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - expected[i])));
    EXPECT_LE(worst, 1e-6) << c["image"] << " at " << c["image_size"];
  }
}

TEST(Preprocess, AnRgbFrameSaidToBeRgbGivesItsBgrTwinsFloatsAndOneNotSaidDoesNot) {
  // A ROS 2 rgb8 image given as BGR runs without an error and scores red as blue: the order is said, not guessed.
  const json cases = read_json(kVectors / "preprocess.json");
  const json& c = cases.at(0);
  const cv::Mat bgr = cv::imread((kVectors / c["image"].get<std::string>()).string(), cv::IMREAD_COLOR);
  ASSERT_FALSE(bgr.empty());
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  sdqes::Preprocess p;
  for (int i = 0; i < 3; ++i) {
    p.mean[i] = c["mean"][i].get<double>();
    p.std[i] = c["std"][i].get<double>();
  }
  const int size = c["image_size"].get<int>();
  EXPECT_EQ(sdqes::preprocess(rgb, size, p, true), sdqes::preprocess(bgr, size, p));
  EXPECT_NE(sdqes::preprocess(rgb, size, p), sdqes::preprocess(bgr, size, p));
  char error[512] = {0};
  sdqes_bundle* b = sdqes_bundle_open((kVectors / "bundle").c_str(), error, sizeof error);
  ASSERT_NE(b, nullptr) << error;
  const int r = sdqes_bundle_image_size(b);
  std::vector<float> from_bgr(3 * r * r), from_rgb(3 * r * r);
  ASSERT_EQ(sdqes_preprocess(b, bgr.data, bgr.rows, bgr.cols, from_bgr.data(), error, sizeof error), 0) << error;
  ASSERT_EQ(sdqes_preprocess_rgb(b, rgb.data, rgb.rows, rgb.cols, from_rgb.data(), error, sizeof error), 0) << error;
  EXPECT_EQ(from_rgb, from_bgr);
  EXPECT_EQ(sdqes_preprocess_rgb(b, nullptr, 48, 64, from_rgb.data(), error, sizeof error), 1);
  EXPECT_EQ(std::string(error), "rgb is NULL; give sdqes_preprocess_rgb a bundle, a frame and 3*R*R floats to write");
  sdqes_bundle_close(b);
}

TEST(Alerts, FireOnTheFramesThePythonPolicyFiresOn) {
  for (const json& c : read_json(kVectors / "alerts.json")) {
    sdqes::AlertPolicy policy;
    const json& p = c["policy"];
    policy.threshold = p["threshold"].get<double>();
    if (p.contains("exit_threshold")) policy.exit_threshold = p["exit_threshold"].get<double>();
    policy.cooldown_s = p.value("cooldown_s", 0.0);
    if (p.contains("max_alerts")) policy.max_alerts = p["max_alerts"].get<int>();
    sdqes::AlertState state(policy);
    std::vector<int> frames;
    const auto probs = c["probs"].get<std::vector<double>>();
    const double fps = c["fps"].get<double>();
    for (size_t t = 0; t < probs.size(); ++t) {
      if (state.update(probs[t], t / fps)) frames.push_back(static_cast<int>(t));
    }
    EXPECT_EQ(frames, c["expected"].get<std::vector<int>>()) << c["name"];
  }
}

TEST(Sampling, AFileServesTheSampleTimesThePythonSamplerServes) {
  for (const json& c : read_json(kVectors / "sampling.json")) {
    const double end_time = c["end_time"].is_null() ? std::numeric_limits<double>::infinity()
                                                    : c["end_time"].get<double>();
    std::vector<int64_t> counts;
    int64_t index = 0;
    for (const double stamp : c["stamps"].get<std::vector<double>>()) {
      counts.push_back(sdqes::samples_served(stamp, index, 1.0 / c["fps"].get<double>(), end_time));
      index += counts.back();
    }
    EXPECT_EQ(counts, c["expected"].get<std::vector<int64_t>>()) << c["name"];
  }
}

TEST(SourceNames, EachSourceIsCalledWhatThePythonRuntimeCallsIt) {
  const json names = read_json(kVectors / "source_names.json");
  for (const auto& [index, name] : names["cameras"].items()) EXPECT_EQ(sdqes::camera_name(std::stoi(index)), name);
  for (const auto& [target, name] : names["live"].items()) EXPECT_EQ(sdqes::live_source_name(target), name) << target;
  for (const auto& [file, name] : names["video_files"].items()) EXPECT_EQ(sdqes::video_file_name(file), name) << file;
  for (const auto& [url, shown] : names["shown"].items()) EXPECT_EQ(sdqes::without_password(url), shown) << url;
  for (const auto& [line, shown] : names["on_a_terminal"].items()) {
    EXPECT_EQ(sdqes::terminal_safe(line), shown) << line;
  }
}

TEST(SourceKinds, EachSourceIsReadAsThePythonRuntimeReadsIt) {
  // Live (a camera, a stream: stamped by the wall clock, reopened when it drops) or a file, decided alike.
  const json vectors = read_json(kVectors / "source_kinds.json");
  for (const auto& [spec, kind] : vectors["kinds"].items()) {
    std::string source = spec;
    const size_t at = source.find("{vectors}");
    if (at != std::string::npos) source.replace(at, 9, fs::absolute(kVectors).string());
    EXPECT_EQ(sdqes::source_kind(source), kind.get<std::string>()) << source;
  }
  EXPECT_EQ(sdqes::reconnect_delays_s(), vectors["reconnect_delays_s"].get<std::vector<double>>());
  std::vector<std::string> stream_urls;  // opened with FFmpeg's timeouts
  for (const auto& [spec, kind] : vectors["kinds"].items()) {
    if (sdqes::is_stream_url(spec)) stream_urls.push_back(spec);
  }
  auto expected = vectors["stream_urls"].get<std::vector<std::string>>();
  std::sort(stream_urls.begin(), stream_urls.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(stream_urls, expected);
  EXPECT_EQ(sdqes::kStreamTimeoutS, vectors["stream_timeout_s"].get<double>());
  EXPECT_EQ(sdqes::kStreamTimeoutMinS, vectors["stream_timeout_min_s"].get<double>());
}

namespace {

struct ReconnectRecord {
  std::vector<double> waited;
  std::vector<std::string> said;
  int opens = 0;
};

int reconnect_with(ReconnectRecord& record, int opens_on_attempt, int stopped_in_wait = 0) {
  return sdqes::reconnect(
      "cam", [&] { return ++record.opens == opens_on_attempt; },
      [&](double s) {
        record.waited.push_back(s);
        return static_cast<int>(record.waited.size()) != stopped_in_wait;
      },
      [&](const std::string& line) { record.said.push_back(line); });
}

}  // namespace

TEST(Reconnect, BacksOffAsThePythonLiveSourceDoesAndSaysEachAttempt) {
  ReconnectRecord back;
  EXPECT_EQ(reconnect_with(back, 3), 3);
  EXPECT_EQ(back.waited, (std::vector<double>{0.5, 1.0, 2.0}));
  EXPECT_EQ(back.said, (std::vector<std::string>{"cam: no frame; reconnecting in 0.5 s (attempt 1 of 5)",
                                                  "cam: no frame; reconnecting in 1 s (attempt 2 of 5)",
                                                  "cam: no frame; reconnecting in 2 s (attempt 3 of 5)",
                                                  "cam: reconnected"}));
  ReconnectRecord gone;  // never back: five attempts over 15.5 s, then the run ends (exit status 1)
  EXPECT_EQ(reconnect_with(gone, 0), 0);
  EXPECT_EQ(gone.opens, 5);
  EXPECT_DOUBLE_EQ(std::accumulate(gone.waited.begin(), gone.waited.end(), 0.0), 15.5);
  EXPECT_EQ(gone.said.back(), "cam: gave up after 5 attempts");
  ReconnectRecord stopped;  // Ctrl-C while it waits: no further attempt
  EXPECT_EQ(reconnect_with(stopped, 0, 2), 0);
  EXPECT_EQ(stopped.opens, 1);
  EXPECT_EQ(stopped.said.size(), 2u);
}

TEST(Reconnect, ACameraOfSeveralIsNotGivenUpButTriedEveryLastDelayAndFoundWhenItComes) {
  ReconnectRecord back;
  int spent = 0;
  const int attempt = sdqes::reconnect(
      "cam", [&] { return ++back.opens == 8; },
      [&](double s) {
        back.waited.push_back(s);
        return true;
      },
      [&](const std::string& line) { back.said.push_back(line); }, sdqes::reconnect_delays_s(), [] { return true; },
      [&] { ++spent; });
  EXPECT_EQ(attempt, 8);
  EXPECT_EQ(back.waited, (std::vector<double>{0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0}));
  EXPECT_EQ(spent, 1);
  ASSERT_EQ(back.said.size(), 7u);  // five attempts said, then the loss, then the return
  EXPECT_EQ(back.said[5], "cam: lost after 5 attempts; tried again every 8 s while another camera sends");
  EXPECT_EQ(back.said[6], "cam: reconnected");
}

TEST(Reconnect, CamerasAllLostGiveUpTogether) {
  ReconnectRecord gone;
  int asked = 0;  // another camera sends for two more attempts, then none does
  EXPECT_EQ(sdqes::reconnect(
                "cam", [&] { return ++gone.opens == 0; },
                [&](double s) {
                  gone.waited.push_back(s);
                  return true;
                },
                [&](const std::string& line) { gone.said.push_back(line); }, sdqes::reconnect_delays_s(),
                [&] { return ++asked <= 2; }),
            0);
  EXPECT_EQ(gone.opens, 7);
  EXPECT_EQ(gone.said.back(), "cam: gave up: every camera of the run is lost");

  sdqes::Cameras cameras(2);
  cameras.lost(0);
  EXPECT_FALSE(cameras.all_lost());
  cameras.lost(1);
  EXPECT_TRUE(cameras.all_lost());
  cameras.found(0);
  EXPECT_FALSE(cameras.all_lost());
}

TEST(Reconnect, AWaitEndsAtOnceWhenTheRunIsAskedToStop) {
  const sdqes::StopOnSignal stop;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(sdqes::wait_unless_stopped(0.1, stop));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  std::raise(SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  EXPECT_FALSE(sdqes::wait_unless_stopped(8.0, stop));  // the longest back-off, cut short
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(1));
}

TEST(SourceNames, SdqesRunNamesAStreamAsLiveAndAnythingElseAsAFile) {
  EXPECT_EQ(sdqes::source_name("rtsp://admin:pw@10.0.0.5:554/live"), "10.0.0.5-554-live");
  EXPECT_EQ(sdqes::source_name("v4l2src device=/dev/video1 ! videoconvert ! appsink"), "v4l2src-device-dev-video1");
  EXPECT_EQ(sdqes::source_name("/data/kitchen.mp4"), "kitchen");
  EXPECT_EQ(sdqes::source_name("https://host/videos/kitchen.mp4?token=abc"), "kitchen");
  EXPECT_EQ(sdqes::source_name("/dev/video0"), "video0");
}

TEST(SourceNames, SourcesNamedAlikeAreRenamedAsThePythonRuntimeRenamesThem) {
  std::vector<std::string> names{"clip", "clip", "garage", "clip", "clip-2"};
  // "clip-2" is taken by the last source, so the second "clip" is "clip-3" (runtime/sources.py gives the same).
  EXPECT_EQ(sdqes::give_distinct_names(names), (std::vector<std::string>{"clip-3", "clip-4"}));
  EXPECT_EQ(names, (std::vector<std::string>{"clip", "clip-3", "garage", "clip-4", "clip-2"}));
  std::vector<std::string> distinct{"kitchen", "garage"};
  EXPECT_TRUE(sdqes::give_distinct_names(distinct).empty());
}

TEST(Alerts, ABadPolicyIsRefused) {
  sdqes::AlertPolicy policy;
  policy.threshold = 1.5;
  EXPECT_THROW(sdqes::AlertState{policy}, sdqes::Error);
}

TEST(Alerts, ANaNCooldownIsRefusedAsPythonRefusesIt) {
  // `cooldown_s < 0` let a NaN through, and a NaN cooldown meant none at all.
  sdqes::AlertPolicy policy;
  policy.cooldown_s = std::nan("");
  EXPECT_THROW(sdqes::AlertState{policy}, sdqes::Error);
  policy.cooldown_s = std::numeric_limits<double>::infinity();  // one alert per query, as in Python
  EXPECT_NO_THROW(sdqes::AlertState{policy});
}

TEST(Bundle, ParsesTheManifestAsThePythonLoaderDoes) {
  const json expected = read_json(kVectors / "bundle_expected.json");
  const sdqes::Bundle b = sdqes::load_bundle(kVectors / "bundle");
  EXPECT_EQ(b.image_size, expected["image_size"].get<int>());
  EXPECT_DOUBLE_EQ(b.fps, expected["fps"].get<double>());
  EXPECT_DOUBLE_EQ(b.default_threshold, expected["default_threshold"].get<double>());
  ASSERT_EQ(b.state.size(), expected["state"].size());
  for (size_t i = 0; i < b.state.size(); ++i) {
    EXPECT_EQ(b.state[i].name, expected["state"][i]["name"].get<std::string>());
    EXPECT_EQ(b.state[i].shape, expected["state"][i]["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(b.state[i].input_name(), "state_in." + b.state[i].name);
  }
  const sdqes::QueryTable q = sdqes::load_queries(b);
  EXPECT_EQ(q.texts, expected["queries"].get<std::vector<std::string>>());
  const auto rows = expected["query_embeddings"].get<std::vector<std::vector<float>>>();
  for (size_t e = 0; e < rows[0].size(); ++e) EXPECT_FLOAT_EQ(q.embeddings[e], rows[0][e]);
}

namespace {

// numpy's .npy format 1.0 for a float32 C-order array [rows, cols], every value `value`.
void write_npy(const fs::path& path, int rows, int cols, float value) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";  // numpy pads the header to 64 bytes
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto length = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  const std::vector<float> values(static_cast<size_t>(rows) * cols, value);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
}

std::string queries_error_of(const sdqes::Bundle& bundle) {
  return message_of([&] { sdqes::load_queries(bundle); });
}

}  // namespace

// The texts and their embeddings must agree row for row (tests/test_bundle_queries.py, the Python side): a query
// added to queries.json only would hand each text its neighbour's embedding. Here the files are changed after the
// bundle loaded, which is what the sha256 in a resealed manifest would let through.
TEST(Bundle, QueriesWhoseTextsAndEmbeddingsDisagreeAreRefused) {
  const fs::path root = copy_bundle("queries");
  const sdqes::Bundle b = sdqes::load_bundle(root);
  const auto expect_refused = [&](const std::string& says) {
    const std::string message = queries_error_of(b);
    EXPECT_NE(message.find("the pre-encoded queries of " + root.string() + " are unusable (" + says),
              std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  };
  EXPECT_EQ(queries_error_of(b), "");
  write_npy(root / "query_embeddings.npy", 1, b.embed_dim + 16, 1.0f);
  expect_refused("query_embeddings.npy is not float32 (1, " + std::to_string(b.embed_dim) + ")");
  write_npy(root / "query_embeddings.npy", 1, b.embed_dim, std::nanf(""));
  expect_refused("query_embeddings.npy holds NaN or infinite values");
  write_npy(root / "query_embeddings.npy", 1, b.embed_dim, 0.5f);
  EXPECT_EQ(queries_error_of(b), "");  // the helper writes what numpy writes
  std::ofstream(root / "queries.json", std::ios::trunc) << R"([{"text": "a"}, {"text": "b"}])";
  expect_refused("queries.json holds 2 queries, manifest.json says 1");
  std::ofstream(root / "queries.json", std::ios::trunc) << R"([{"text": 3}])";
  expect_refused("queries.json is not a list of {text, response[, label][, threshold in (0, 1)]} objects");
  std::ofstream(root / "queries.json", std::ios::trunc) << R"([{"text": "a", "threshold": 1.5}])";
  expect_refused("queries.json is not a list of {text, response[, label][, threshold in (0, 1)]} objects");
  std::ofstream(root / "queries.json", std::ios::trunc) << R"([{"text": "a", "label": "open_door", "threshold": 0.7}])";
  const sdqes::QueryTable q = sdqes::load_queries(b);  // a query exported with its label and threshold
  EXPECT_EQ(q.labels, std::vector<std::string>{"open_door"});
  ASSERT_TRUE(q.thresholds[0].has_value());
  EXPECT_DOUBLE_EQ(*q.thresholds[0], 0.7);
  fs::remove_all(root);
}

// Each query alerts under the policy `sdqes-edge run` gives it: its own threshold, the option's, its label's or the
// default, and the recorded hysteresis and cooldown (tests/vectors/query_policies.json, written by Python).
TEST(QueryPolicies, EachQueryAlertsUnderThePolicyThePythonRuntimeGivesIt) {
  for (const json& c : read_json(kVectors / "query_policies.json")) {
    sdqes::Bundle b;
    sdqes::parse_thresholds(c["thresholds"], b);
    sdqes::PolicyOptions options;
    const json& o = c["options"];
    if (o.contains("threshold")) options.threshold = o["threshold"].get<double>();
    if (o.contains("exit_threshold")) options.exit_threshold = o["exit_threshold"].get<double>();
    if (o.contains("cooldown_s")) options.cooldown_s = o["cooldown_s"].get<double>();
    if (o.contains("max_alerts")) options.max_alerts = o["max_alerts"].get<int>();
    const json& q = c["query"];
    const auto own = q.contains("threshold") ? std::optional<double>(q["threshold"].get<double>()) : std::nullopt;
    const sdqes::AlertPolicy policy = sdqes::query_policy(b, q.value("label", ""), own, options);
    const json& e = c["expected"];
    const std::string name = c["name"].get<std::string>();
    EXPECT_EQ(policy.threshold, e["threshold"].get<double>()) << name;
    EXPECT_EQ(policy.exit_threshold.has_value(), !e["exit_threshold"].is_null()) << name;
    if (policy.exit_threshold) EXPECT_EQ(*policy.exit_threshold, e["exit_threshold"].get<double>()) << name;
    EXPECT_EQ(policy.cooldown_s, e["cooldown_s"].get<double>()) << name;
    EXPECT_EQ(policy.max_alerts.has_value(), !e["max_alerts"].is_null()) << name;
    if (policy.max_alerts) EXPECT_EQ(*policy.max_alerts, e["max_alerts"].get<int>()) << name;
  }
}

TEST(QueryPolicies, ALabelsThresholdThatIsNoProbabilityIsRefusedNamingIt) {
  sdqes::Bundle b;
  const std::string message = message_of([&] {
    sdqes::parse_thresholds(json::parse(R"({"default": 0.5, "per_label": {"open_door": 1.5}})"), b);
  });
  EXPECT_EQ(message, "thresholds/per_label/open_door: 1.5 is not a probability in (0, 1)");
}

TEST(Bundle, RefusesDamageNamingTheFile) {
  const fs::path corrupted = copy_bundle("hash");
  std::ofstream(corrupted / "step.fp32.onnx", std::ios::app) << "x";
  EXPECT_NE(error_of(corrupted).find("step.fp32.onnx does not match the sha256"), std::string::npos);

  const fs::path garbled = copy_bundle("json");
  std::ofstream(garbled / "manifest.json", std::ios::trunc) << "{";
  EXPECT_NE(error_of(garbled).find("not valid JSON"), std::string::npos);

  const fs::path newer = copy_bundle("version");
  json m = read_json(newer / "manifest.json");
  m["format_version"] = 99;
  std::ofstream(newer / "manifest.json", std::ios::trunc) << m.dump();
  EXPECT_NE(error_of(newer).find("newer than this runtime reads"), std::string::npos);

  const fs::path rewired = copy_bundle("wiring");
  m = read_json(rewired / "manifest.json");
  std::reverse(m["state"].begin(), m["state"].end());
  std::ofstream(rewired / "manifest.json", std::ios::trunc) << m.dump();
  EXPECT_NE(error_of(rewired).find("disagree with the state spec"), std::string::npos);

  for (const auto& p : {corrupted, garbled, newer, rewired}) fs::remove_all(p);
}

// Laid out as tests/native_vectors.py plant_confinement_case does: the bundle's own step graph copied to
// work/outside/evil.onnx, listed with its true sha256, so only the path gives it away.
TEST(Bundle, RefusesEveryManifestEntryOutsideTheBundle) {
  for (const json& c : read_json(kVectors / "confinement.json")) {
    const std::string name = c["name"].get<std::string>();
    const fs::path work = fs::temp_directory_path() / ("sdqes-native-confine-" + std::to_string(::getpid()));
    fs::remove_all(work);
    fs::create_directories(work / "outside");
    fs::copy(kVectors / "bundle", work / "bundle", fs::copy_options::recursive);
    fs::copy_file(work / "bundle" / "step.fp32.onnx", work / "outside" / "evil.onnx");
    if (c.contains("symlink")) fs::create_directory_symlink(work / "outside", work / "bundle" / c["symlink"].get<std::string>());
    std::string entry = c["entry"].get<std::string>();
    const std::string marker = "{outside}";
    if (const auto at = entry.find(marker); at != std::string::npos) {
      entry.replace(at, marker.size(), fs::canonical(work / "outside").string());
    }
    json m = read_json(work / "bundle" / "manifest.json");
    m["files"][entry] = {{"sha256", sdqes::sha256_file(work / "outside" / "evil.onnx")},
                         {"bytes", fs::file_size(work / "outside" / "evil.onnx")}};
    if (c["use_as"] == "step graph") m["graphs"]["step"]["fp32"]["file"] = entry;
    std::ofstream(work / "bundle" / "manifest.json", std::ios::trunc) << m.dump();
    EXPECT_NE(error_of(work / "bundle").find("outside the bundle"), std::string::npos) << name;
    fs::remove_all(work);
  }
}

TEST(Bundle, AMissingEngineSaysHowToBuildOne) {
  const sdqes::Bundle b = sdqes::load_bundle(kVectors / "bundle");
  try {
    sdqes::find_engine(b, "fp16");
    FAIL() << "no engine should be found";
  } catch (const sdqes::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sdqes-edge build-engine"), std::string::npos);
  }
}

// A bundle carrying engines for two devices, with sidecars as build-engine writes them: the engine built for this
// GPU's architecture and this TensorRT release is chosen, whatever order the folders are listed in.
TEST(Bundle, TheEngineForThisGpuAndTensorRTIsChosenByItsSidecar) {
  const fs::path root = copy_bundle("engines");
  const auto plant = [&](const std::string& folder, json cc, const std::string& version) {
    fs::create_directories(root / "engines" / folder);
    std::ofstream(root / "engines" / folder / "step.fp16.engine") << "engine";
    std::ofstream(root / "engines" / folder / "step.fp16.json")
        << json{{"compute_capability", cc}, {"tensorrt_version", version}}.dump();
  };
  plant("jetson-orin-sm87-trt10.3.0", {8, 7}, "10.3.0");
  plant("nvidia-h100-sm90-trt11.0.0.5", {9, 0}, "11.0.0.5");
  const sdqes::Bundle b = sdqes::load_bundle(root);

  EXPECT_EQ(sdqes::find_engine(b, "fp16", sdqes::EngineTarget{9, 0, "11.0.0"}).parent_path().filename(),
            "nvidia-h100-sm90-trt11.0.0.5");  // the build number is not part of the match
  EXPECT_EQ(sdqes::find_engine(b, "fp16", sdqes::EngineTarget{8, 7, "10.3.0.26"}).parent_path().filename(),
            "jetson-orin-sm87-trt10.3.0");
  try {
    sdqes::find_engine(b, "fp16", sdqes::EngineTarget{8, 7, "10.4.0"});
    FAIL() << "an engine of another TensorRT release must not be chosen";
  } catch (const sdqes::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("no fp16 TensorRT engine for sm87 with TensorRT 10.4.0"), std::string::npos) << message;
    EXPECT_NE(message.find("jetson-orin-sm87-trt10.3.0 (sm87, TensorRT 10.3.0)"), std::string::npos) << message;
    EXPECT_NE(message.find("sdqes-edge build-engine " + root.string() + " --precision fp16"), std::string::npos);
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  fs::remove_all(root);
}

// An engines folder copied in from another export of the model: its sidecar names the graph it was built from by its
// sha256, which is not this bundle's, so the engine is refused rather than run with the other model's weights.
TEST(Bundle, AnEngineBuiltFromAnotherExportsStepGraphIsRefused) {
  const fs::path root = copy_bundle("stale-engine");
  const sdqes::Bundle b = sdqes::load_bundle(root);
  const std::string graph = b.step_graph("fp32").filename().string();
  const std::string own = b.manifest["files"][graph]["sha256"].get<std::string>();
  const auto plant = [&](const std::string& built_from) {
    fs::create_directories(root / "engines" / "jetson-orin-sm87-trt10.3.0");
    std::ofstream(root / "engines" / "jetson-orin-sm87-trt10.3.0" / "step.fp16.engine") << "engine";
    std::ofstream(root / "engines" / "jetson-orin-sm87-trt10.3.0" / "step.fp16.json")
        << json{{"compute_capability", {8, 7}}, {"tensorrt_version", "10.3.0"}, {"source_graph", graph},
                {"source_graph_sha256", built_from}}.dump();
  };
  const sdqes::EngineTarget orin{8, 7, "10.3.0"};
  plant(std::string(64, '0'));
  try {
    sdqes::find_engine(b, "fp16", orin);
    FAIL() << "an engine built from another graph must not be chosen";
  } catch (const sdqes::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("that is not this bundle's"), std::string::npos) << message;
    EXPECT_NE(message.find("sdqes-edge build-engine " + root.string() + " --precision fp16"), std::string::npos);
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  plant(own);
  EXPECT_EQ(sdqes::find_engine(b, "fp16", orin).parent_path().filename(), "jetson-orin-sm87-trt10.3.0");
  fs::remove_all(root);
}

// The manifest and an engine's sidecar are found by their names, not through the manifest: a symlink in their place
// led the loader to read whatever it pointed to. Refused, as the Python loader refuses them.
TEST(Bundle, ANameTheRuntimeLooksForItselfIsNotFollowedOutOfTheBundleByASymlink) {
  const fs::path root = copy_bundle("symlinked-names");
  const fs::path outside = root.parent_path() / "symlinked-names-outside";
  fs::remove_all(outside);
  fs::create_directories(outside);
  const auto expect_refused = [&](const std::function<void()>& load, const std::string& what) {
    try {
      load();
      FAIL() << what << " behind a symlink leading out must be refused";
    } catch (const sdqes::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(what), std::string::npos) << message;
      EXPECT_NE(message.find("leads outside the bundle through a symlink"), std::string::npos) << message;
    }
  };
  const fs::path folder = root / "engines" / "jetson-orin-sm87-trt10.3.0";
  fs::create_directories(folder);
  std::ofstream(folder / "step.fp16.engine") << "engine";
  std::ofstream(outside / "sidecar.json") << json{{"compute_capability", {8, 7}}, {"tensorrt_version", "10.3.0"}}.dump();
  fs::create_symlink(outside / "sidecar.json", folder / "step.fp16.json");
  const sdqes::Bundle b = sdqes::load_bundle(root);
  expect_refused([&] { sdqes::find_engine(b, "fp16", sdqes::EngineTarget{8, 7, "10.3.0"}); }, "step.fp16.json");
  fs::rename(root / "manifest.json", outside / "manifest.json");
  fs::create_symlink(outside / "manifest.json", root / "manifest.json");
  expect_refused([&] { sdqes::load_bundle(root); }, "manifest.json");
  fs::remove_all(root);
  fs::remove_all(outside);
}

// The manifest carries no hash; the step graph's own description (its metadata, hashed with the graph) says which
// frame, batch and normalization it was exported for. A manifest edited after export is refused, naming the field,
// as the Python loader refuses it; before, the native runtime normalized with an edited mean and std, silently.
TEST(Bundle, AManifestThatDisagreesWithItsStepGraphIsRefusedNamingTheField) {
  // The shared bundle's graphs are stubs; this one is a ModelProto with a doc string (field 6) and the description
  // an export writes (metadata_props, field 14: {key 1, value 2}), made from the shared manifest.
  const auto field = [](int number, const std::string& bytes) {
    std::string out(1, static_cast<char>((number << 3) | 2));
    for (uint64_t n = bytes.size(); ; n >>= 7) {
      out += static_cast<char>((n & 0x7F) | (n > 0x7F ? 0x80 : 0));
      if (n <= 0x7F) break;
    }
    return out + bytes;
  };
  const auto with_described_graph = [&](const std::string& name) {
    const fs::path root = copy_bundle(name);
    json manifest = json::parse(std::ifstream(root / "manifest.json"));
    json description = {{"image_size", manifest["image_size"]}, {"embed_dim", manifest["embed_dim"]},
                        {"batch", manifest["batch"]}, {"query_count", nullptr},
                        {"preprocess", manifest["preprocess"]}};
    const std::string graph = manifest["graphs"]["step"]["fp32"]["file"].get<std::string>();
    std::ofstream(root / graph, std::ios::binary)
        << field(6, std::string(300, 'd')) << field(14, field(1, sdqes::kMetadataKey) + field(2, description.dump()));
    manifest["files"][graph]["sha256"] = sdqes::sha256_file(root / graph);
    std::ofstream(root / "manifest.json") << manifest.dump(2);
    return std::make_pair(root, manifest);
  };

  const auto [intact, manifest] = with_described_graph("described");
  const sdqes::Bundle b = sdqes::load_bundle(intact);  // the manifest agrees with its graph
  const auto props = sdqes::metadata_props(b.step_graph("fp32"));
  ASSERT_EQ(props.count(sdqes::kMetadataKey), 1u);
  EXPECT_EQ(json::parse(props.at(sdqes::kMetadataKey)).at("preprocess"), manifest.at("preprocess"));
  fs::remove_all(intact);

  const int size = manifest.at("image_size").get<int>();
  const auto edited = [&](const std::string& name, const std::function<void(json&)>& change) {
    auto [root, m] = with_described_graph(name);
    change(m);
    std::ofstream(root / "manifest.json") << m.dump(2);
    return root;
  };
  for (const auto& [root, words] : std::vector<std::pair<fs::path, std::string>>{
           {edited("edited-size", [&](json& m) { m["image_size"] = size * 2; }),
            "says image_size " + std::to_string(size * 2) + ", but step.fp32.onnx was exported with " +
                std::to_string(size)},
           {edited("edited-mean", [](json& m) { m["preprocess"]["mean"][0] = 0.5; }),
            "says another preprocess than step.fp32.onnx was exported with"}}) {
    const std::string message = error_of(root);
    EXPECT_NE(message.find(words), std::string::npos) << message;
    EXPECT_NE(message.find("the manifest was edited or damaged after export"), std::string::npos) << message;
    fs::remove_all(root);
  }
}

TEST(CApi, OpensABundleAndReportsErrorsAsText) {
  char error[512] = {0};
  sdqes_bundle* b = sdqes_bundle_open((kVectors / "bundle").c_str(), error, sizeof error);
  ASSERT_NE(b, nullptr) << error;
  EXPECT_GT(sdqes_bundle_fps(b), 0);
  const int size = sdqes_bundle_image_size(b);
  std::vector<uint8_t> frame(48 * 64 * 3, 128);
  std::vector<float> out(3 * size * size);
  EXPECT_EQ(sdqes_preprocess(b, frame.data(), 48, 64, out.data(), error, sizeof error), 0) << error;
  sdqes_bundle_close(b);
  EXPECT_EQ(sdqes_bundle_open("/nonexistent", error, sizeof error), nullptr);
  EXPECT_NE(std::string(error).find("does not exist"), std::string::npos);
  sdqes_alert* a = sdqes_alert_new(0.6, -1, 0, 0, error, sizeof error);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(sdqes_alert_update(a, 0.7, 0.0), 1);
  EXPECT_EQ(sdqes_alert_update(a, 0.8, 1.0), 0);
  sdqes_alert_free(a);
}

TEST(CApi, AnAlertRefusesATimeThatGoesBackOrIsNotFiniteAndResetStartsANewStream) {
  // A ROS node that starts a new stream on the same alert (its clock from 0 again) got no alert for as long as the
  // last one's time plus the cooldown, without a word; a NaN time let every later alert past the cooldown.
  char error[512] = {0};
  sdqes_alert* a = sdqes_alert_new(0.6, -1, 10.0, 0, error, sizeof error);
  ASSERT_NE(a, nullptr) << error;
  EXPECT_EQ(sdqes_alert_update(a, 0.7, 100.0), 1);
  EXPECT_EQ(sdqes_alert_update(a, 0.5, 101.0), 0);
  EXPECT_EQ(sdqes_alert_update(a, 0.7, 0.0), -1);  // went back: refused, nothing changed
  EXPECT_EQ(sdqes_alert_update(a, 0.7, std::nan("")), -1);
  EXPECT_EQ(sdqes_alert_update(a, std::nan(""), 102.0), -1);
  EXPECT_EQ(sdqes_alert_update(a, std::numeric_limits<double>::infinity(), 102.0), -1);
  EXPECT_EQ(sdqes_alert_update(a, 0.7, 105.0), 0);  // a rising edge within the 10 s cooldown: quiet, as before
  EXPECT_EQ(sdqes_alert_reset(a), 0);
  EXPECT_EQ(sdqes_alert_update(a, 0.7, 0.0), 1);  // the new stream alerts at once
  EXPECT_EQ(sdqes_alert_update(a, 0.7, 0.0), 0);  // the same time again is taken: still above, no new edge
  EXPECT_EQ(sdqes_alert_reset(nullptr), -1);
  sdqes_alert_free(a);
}

TEST(CApi, AQuerysAlertTakesTheBundlesThresholdForItsLabelAndTheRecordedPolicy) {
  // The calibrated thresholds of tests/vectors/query_policies.json, written into a copy of the shared bundle.
  const fs::path bundle = fs::temp_directory_path() / ("sdqes-native-calibrated-" + std::to_string(::getpid()));
  fs::remove_all(bundle);
  fs::copy(kVectors / "bundle", bundle, fs::copy_options::recursive);
  json manifest = read_json(bundle / "manifest.json");
  manifest["thresholds"] = {{"default", 0.6},
                            {"per_label", {{"open_door", 0.7}, {"boil_water", 0.45}}},
                            {"policy", {{"exit_margin", 0.05}, {"cooldown_s", 20.0}}}};
  std::ofstream(bundle / "manifest.json") << manifest.dump();
  char error[512] = {0};
  sdqes_bundle* b = sdqes_bundle_open(bundle.c_str(), error, sizeof error);
  ASSERT_NE(b, nullptr) << error;
  const auto alerts = [&](const char* label, const std::vector<double>& probs) {
    sdqes_alert* a = sdqes_alert_for_label(b, label, error, sizeof error);
    EXPECT_NE(a, nullptr) << error;
    std::vector<int> frames;
    for (size_t t = 0; a && t < probs.size(); ++t) {
      if (sdqes_alert_update(a, probs[t], static_cast<double>(t)) == 1) frames.push_back(static_cast<int>(t));
    }
    sdqes_alert_free(a);
    return frames;
  };
  const std::vector<double> probs{0.62, 0.5, 0.68, 0.72, 0.5, 0.8};
  EXPECT_EQ(alerts("open_door", probs), std::vector<int>{3});  // 0.7; then 20 s of cooldown
  EXPECT_EQ(alerts("boil_water", probs), std::vector<int>{0});  // 0.45, on until p <= 0.40, then cooldown
  EXPECT_EQ(alerts(nullptr, probs), std::vector<int>{0});        // the default 0.6
  EXPECT_EQ(alerts("sit_down", {0.62, 0.58, 0.61}), std::vector<int>{0});  // hysteresis: on until p <= 0.55
  EXPECT_EQ(sdqes_alert_for_label(nullptr, "open_door", error, sizeof error), nullptr);
  EXPECT_NE(std::string(error).find("bundle is NULL"), std::string::npos) << error;
  sdqes_bundle_close(b);
  fs::remove_all(bundle);
}

TEST(CApi, RefusesNullHandlesAndANaNExitThresholdInsteadOfCrashingOrUnsettingIt) {
  char error[512] = {0};
  EXPECT_EQ(sdqes_bundle_open(nullptr, error, sizeof error), nullptr);
  EXPECT_NE(std::string(error).find("bundle path is NULL"), std::string::npos) << error;
  EXPECT_EQ(sdqes_bundle_fps(nullptr), 0.0);
  EXPECT_EQ(sdqes_bundle_image_size(nullptr), 0);
  EXPECT_EQ(sdqes_bundle_default_threshold(nullptr), 0.0);
  std::vector<uint8_t> frame(48 * 64 * 3, 128);
  std::vector<float> out(3 * 32 * 32);
  EXPECT_EQ(sdqes_preprocess(nullptr, frame.data(), 48, 64, out.data(), error, sizeof error), 1);
  EXPECT_NE(std::string(error).find("bundle is NULL"), std::string::npos) << error;
  sdqes_bundle* b = sdqes_bundle_open((kVectors / "bundle").c_str(), error, sizeof error);
  ASSERT_NE(b, nullptr) << error;
  EXPECT_EQ(sdqes_preprocess(b, nullptr, 48, 64, out.data(), error, sizeof error), 1);
  EXPECT_NE(std::string(error).find("bgr is NULL"), std::string::npos) << error;
  EXPECT_EQ(sdqes_preprocess(b, frame.data(), 48, 64, nullptr, error, sizeof error), 1);
  EXPECT_NE(std::string(error).find("out is NULL"), std::string::npos) << error;
  for (const auto& [height, width] : {std::pair{-1, 64}, std::pair{48, 0}}) {  // -1: "vector::_M_default_append"
    EXPECT_EQ(sdqes_preprocess(b, frame.data(), height, width, out.data(), error, sizeof error), 1);
    EXPECT_EQ(std::string(error), "got an empty frame of height " + std::to_string(height) + " and width " +
                                      std::to_string(width) + "; give an image at least 1x1 pixel");
  }
  sdqes_bundle_close(b);
  EXPECT_EQ(sdqes_alert_update(nullptr, 0.7, 0.0), -1);
  EXPECT_EQ(sdqes_alert_new(0.6, std::nan(""), 0, 0, error, sizeof error), nullptr);  // was: no exit threshold
  EXPECT_NE(std::string(error).find("exit threshold nan must lie in [0, threshold 0.6]: give one at or below"),
            std::string::npos) << error;
}

TEST(AlertEvent, RecordsWhenItWasRaisedInUtcAsThePythonRuntimeDoes) {
  // ISO 8601 to the millisecond with a Z, as runtime/sinks.py's utc_timestamp writes it: an alert log read beside
  // the world's clocks, whichever runtime wrote it.
  const std::time_t before = std::time(nullptr);
  sdqes::AlertEvent event;
  const std::string stamp = event.to_json().at("wall_time").get<std::string>();
  EXPECT_TRUE(std::regex_match(stamp, std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z)"))) << stamp;
  std::tm utc{};
  gmtime_r(&before, &utc);
  char year[8];
  std::strftime(year, sizeof year, "%Y", &utc);
  EXPECT_EQ(stamp.substr(0, 4), year);
}

TEST(AlertEvent, WritesTheFieldsThePythonAlertLogWrites) {
  // tests/vectors/alert_events.json: AlertEvent.to_dict of runtime/sinks.py, every key and value. A reader of the
  // alert log (a dashboard, a home-automation rule) sees one format whichever runtime raised the alert.
  for (const json& line : read_json(kVectors / "alert_events.json")) {
    sdqes::AlertEvent event{line.at("query_id"), line.at("query"), line.at("message"), line.at("stream"),
                            line.at("stream_time"), line.at("frame_index"), line.at("score"), line.at("cosine"),
                            line.at("latency_ms"), line.at("threshold")};
    if (!line.at("label").is_null()) event.label = line.at("label").get<std::string>();
    event.wall_time = line.at("wall_time");
    EXPECT_EQ(event.to_json(), line) << event.to_json().dump();
  }
}

TEST(JsonlSink, FollowsALogRotatedUnderItAsThePythonSinkDoes) {
  const fs::path dir = fs::temp_directory_path() / ("sdqes-native-rotation-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path log = dir / "alerts.jsonl";
  const auto frames_in = [](const fs::path& path) {
    std::vector<int64_t> frames;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) frames.push_back(json::parse(line).at("frame_index"));
    return frames;
  };
  sdqes::AlertEvent event;
  event.query_id = "q1";
  {
    sdqes::JsonlSink sink(log);
    event.frame_index = 1;
    sink.write(event);
    fs::rename(log, dir / "alerts.jsonl.1");  // logrotate: moved away, no new file made yet
    event.frame_index = 2;
    sink.write(event);
    fs::copy_file(log, dir / "alerts.jsonl.2");  // copytruncate: emptied in place
    fs::resize_file(log, 0);
    event.frame_index = 3;
    sink.write(event);
    fs::rename(log, dir / "alerts.jsonl.3");
    fs::create_directory(log);  // the path cannot be a file for now: on into the moved file, said once
    event.frame_index = 4;
    sink.write(event);
    fs::remove(log);
    event.frame_index = 5;
    sink.write(event);
  }
  EXPECT_EQ(frames_in(dir / "alerts.jsonl.1"), std::vector<int64_t>{1});
  EXPECT_EQ(frames_in(dir / "alerts.jsonl.2"), std::vector<int64_t>{2});
  EXPECT_EQ(frames_in(dir / "alerts.jsonl.3"), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(frames_in(log), std::vector<int64_t>{5});
  fs::remove_all(dir);
}

namespace {

// A real refusal: a file-size limit fails every write past it with EFBIG, as a full disk fails them (ENOSPC).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) : handler_(std::signal(SIGXFSZ, SIG_IGN)) {  // else the kernel kills us
    getrlimit(RLIMIT_FSIZE, &before_);
    rlimit limited = before_;
    limited.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &before_);
    std::signal(SIGXFSZ, handler_);
  }

 private:
  rlimit before_{};
  void (*handler_)(int);
};

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(text.empty() || text.back() == '\n');  // whole lines only
  std::vector<std::string> lines;
  std::istringstream split(text);
  for (std::string line; std::getline(split, line);) lines.push_back(line);
  return lines;
}

sdqes::AlertEvent long_alert(int64_t frame) {
  sdqes::AlertEvent event;
  event.query_id = "q1";
  event.query = "When I start to clean the table, remind me to wash my hands.";
  event.message = std::string(400, 'w');
  event.stream = "clip";
  event.frame_index = frame;
  return event;
}

}  // namespace

TEST(JsonlSink, HoldsAlertsTheDiskRefusesSaysSoOnceAndWritesThemInOrderWithTheNextItTakes) {
  const fs::path log = fs::temp_directory_path() / ("sdqes-native-held-" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(log) << "{\"from\":\"an earlier run\"}\n";  // appended to, never rewritten
  testing::internal::CaptureStderr();
  {
    sdqes::JsonlSink sink(log);
    {
      const FileSizeLimit limit(2048);  // a few lines of ~600 bytes fit; the later ones are held, nothing thrown
      for (int64_t frame = 0; frame < 8; ++frame) sink.write(long_alert(frame));
    }
    sink.write(long_alert(8));  // room again: every held alert goes first, in order
    sink.finish();
  }
  const std::string said = testing::internal::GetCapturedStderr();
  const std::string warning = "sdqes-run: warning: cannot append alerts to the alert log " + log.string() +
                              " (File too large); the stream goes on alerting, its latest 10000 alerts held in "
                              "memory and written with the next alert the disk takes, or tried again every 30 s\n";
  EXPECT_EQ(said, warning + "sdqes-run: note: the alert log " + log.string() +
                      " is written again, the alerts held meanwhile with it\n");
  const auto lines = lines_of(log);
  ASSERT_EQ(lines.size(), 10u);
  for (int64_t frame = 0; frame <= 8; ++frame) EXPECT_EQ(json::parse(lines[frame + 1]).at("frame_index"), frame);
  fs::remove(log);
}

TEST(JsonlSink, NamesTheFileAndTheAlertsItLostWhenTheDiskStillRefusesThemAtTheEnd) {
  const fs::path log = fs::temp_directory_path() / ("sdqes-native-lost-" + std::to_string(::getpid()) + ".jsonl");
  std::string error;
  size_t kept = 0;
  testing::internal::CaptureStderr();
  {
    sdqes::JsonlSink sink(log);
    const FileSizeLimit limit(2048);
    for (int64_t frame = 0; frame < 8; ++frame) sink.write(long_alert(frame));
    kept = lines_of(log).size();
    try {
      sink.finish();
    } catch (const sdqes::OutputRefused& e) {  // the machine's state: sdqes-run's exit status 1, not a usage error's
      error = e.what();
    }
  }
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(error, "cannot append alerts to " + log.string() + " (File too large; " + std::to_string(8 - kept) +
                       " of the " + std::to_string(8 - kept) + " alerts it refused meanwhile are not in it): the file "
                       "is as large as its file system (FAT32: 4 GiB) or `ulimit -f` allows; write to another disk, "
                       "and run again");
  EXPECT_GT(kept, 0u);
  EXPECT_EQ(lines_of(log).size(), kept);
  fs::remove(log);
}

TEST(JsonlSink, WritesAFramesAlertsTogetherEveryOneOfThemAndHoldsTheLatestOfThoseTheDiskRefuses) {
  // A service's queries file of a dataset's (thousands) alerting at a stream's first frame: all written while the
  // disk takes them, however many more than are held while it refuses.
  const fs::path log = fs::temp_directory_path() / ("sdqes-native-burst-" + std::to_string(::getpid()) + ".jsonl");
  const auto burst = [](int64_t first, size_t count) {
    std::vector<sdqes::AlertEvent> events;
    for (size_t q = 0; q < count; ++q) {
      events.push_back(long_alert(first));
      events.back().query_id = "q" + std::to_string(q + 1);
    }
    return events;
  };
  const size_t more = sdqes::JsonlSink::kHeldAlerts + 5;
  testing::internal::CaptureStderr();
  {
    sdqes::JsonlSink sink(log);
    sink.write(burst(0, more));
    EXPECT_EQ(lines_of(log).size(), more);
    {
      const FileSizeLimit limit(fs::file_size(log) + 100);  // less than a line more
      sink.write(burst(1, more));
    }
    EXPECT_EQ(lines_of(log).size(), more);
    sink.write(burst(2, 1));  // room again: the latest held (one fewer, to make room for it), then this frame's
    sink.finish();
  }
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("is written again, the alerts held meanwhile with it (6 older ones were let go)"),
            std::string::npos) << said;
  const auto lines = lines_of(log);
  ASSERT_EQ(lines.size(), more + sdqes::JsonlSink::kHeldAlerts);
  EXPECT_EQ(json::parse(lines[more]).at("query_id"), "q7");  // the 6 oldest of the refused frame let go
  EXPECT_EQ(json::parse(lines[more]).at("frame_index"), 1);
  EXPECT_EQ(json::parse(lines.back()).at("frame_index"), 2);
  fs::remove(log);
}

TEST(StopOnSignal, AFirstSignalAsksTheLoopToStopWithTheShellsExitStatusAndTheOldHandlerReturnsAfter) {
  static volatile std::sig_atomic_t before = 0;  // a handler the program had before the stream
  std::signal(SIGTERM, [](int) { before = 1; });
  {
    const sdqes::StopOnSignal stop;
    EXPECT_FALSE(stop.requested());
    EXPECT_EQ(stop.exit_code(), 0);
    std::raise(SIGTERM);  // docker stop, systemd: the process lives on to finish its frame
    EXPECT_TRUE(stop.requested());
    EXPECT_EQ(stop.signal_name(), "SIGTERM");
    EXPECT_EQ(stop.exit_code(), 143);
    EXPECT_EQ(before, 0);
  }
  std::raise(SIGTERM);
  EXPECT_EQ(before, 1);
  std::signal(SIGTERM, SIG_DFL);
}

TEST(StopOnSignal, ASecondSignalEndsTheProcessAtOnce) {
  // A loop stuck on a dead camera must still stop: the second Ctrl-C is the default action, death by SIGINT.
  EXPECT_EXIT(
      {
        const sdqes::StopOnSignal stop;
        std::raise(SIGINT);
        std::raise(SIGINT);
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGINT), "");
}
