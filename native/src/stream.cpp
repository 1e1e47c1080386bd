// Preprocessing, scoring, alert policy and the JSONL sink: twins of runtime/preprocess.py, alerts.py, sinks.py.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include <sys/stat.h>
#include <unistd.h>

#include "sdqes/runtime.hpp"
#include "sdqes/saved_files.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sdqes {

namespace {

// PIL's bicubic kernel (a = -0.5), as runtime/preprocess.py.
double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// Output o = sum_k input[start[o] + k] * weights[o * taps + k] (runtime/preprocess.py resize_coefficients).
struct Coefficients {
  int taps = 0;
  std::vector<int> start;
  std::vector<double> weights;
};

Coefficients coefficients(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  Coefficients c;
  c.taps = std::min(static_cast<int>(std::ceil(support)) * 2 + 1, in_size);
  c.start.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.taps, 0.0);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const int first = std::max(static_cast<int>(center - support + 0.5), 0);
    const int last = std::min(static_cast<int>(center + support + 0.5), in_size);
    std::vector<double> w(static_cast<size_t>(last - first));
    double total = 0.0;
    for (int i = 0; i < last - first; ++i) total += (w[i] = bicubic((i + first - center + 0.5) / filter_scale));
    const int start = std::min(first, in_size - c.taps);
    c.start[o] = start;
    for (int i = 0; i < last - first; ++i) c.weights[static_cast<size_t>(o) * c.taps + (first - start) + i] = w[i] / total;
  }
  return c;
}

// The coefficients of a frame's two passes, columns (w -> new_w) and rows (h -> new_h), made once per size on each
// thread that preprocesses (a reader thread per source) and kept: a source's frames are one size, and remaking them
// cost every frame about 600 allocations and 13,000 kernel evaluations. A thread's cache is its own, so no lock; a
// source whose size keeps changing starts it afresh (std::map keeps what it returned in place as it grows).
std::pair<const Coefficients*, const Coefficients*> cached_coefficients(int w, int new_w, int h, int new_h) {
  constexpr size_t kSizesKept = 16;
  thread_local std::map<std::pair<int, int>, Coefficients> made;
  const std::pair<int, int> columns{w, new_w}, rows{h, new_h};
  if (made.size() >= kSizesKept && (!made.count(columns) || !made.count(rows))) made.clear();
  for (const auto& key : {columns, rows}) {
    if (!made.count(key)) made.emplace(key, coefficients(key.first, key.second));
  }
  return {&made.at(columns), &made.at(rows)};
}

// The input rows [first, last) that outputs [first_out, first_out + count) of `c` read.
std::pair<int, int> input_span(const Coefficients& c, int first_out, int count) {
  int first = c.start[first_out], last = c.start[first_out] + c.taps;
  for (int o = first_out; o < first_out + count; ++o) {
    first = std::min(first, c.start[o]);
    last = std::max(last, c.start[o] + c.taps);
  }
  return {first, last};
}

// The horizontal pass: output columns [left, left + out_w) of input rows [y0, y1) (those the vertical pass reads)
// -> [y1 - y0, out_w, 3], clipped to the 8-bit range as PIL clips. Each output sums its taps in order, the three
// channels side by side; the columns read are widened to double once a row, not once a tap.
std::vector<double> resample_columns(const cv::Mat& bgr, const Coefficients& cx, int left, int out_w, int y0,
                                     int y1) {
  const auto [x0, x1] = input_span(cx, left, out_w);  // a center crop of a 16:9 frame reads 60% of its columns
  std::vector<double> horizontal(static_cast<size_t>(y1 - y0) * out_w * 3);
  std::vector<double> row(static_cast<size_t>(x1 - x0) * 3);
  for (int y = y0; y < y1; ++y) {
    const uint8_t* pixels = bgr.ptr<uint8_t>(y) + static_cast<size_t>(x0) * 3;
    std::copy(pixels, pixels + row.size(), row.begin());
    double* written = &horizontal[static_cast<size_t>(y - y0) * out_w * 3];
    for (int x = 0; x < out_w; ++x) {
      const int o = left + x;
      const double* wk = &cx.weights[static_cast<size_t>(o) * cx.taps];
      const double* in = &row[static_cast<size_t>(cx.start[o] - x0) * 3];
      double b = 0.0, g = 0.0, r = 0.0;
      for (int k = 0; k < cx.taps; ++k) {
        b += in[3 * k] * wk[k];
        g += in[3 * k + 1] * wk[k];
        r += in[3 * k + 2] * wk[k];
      }
      written[3 * x] = std::clamp(b, 0.0, 255.0);
      written[3 * x + 1] = std::clamp(g, 0.0, 255.0);
      written[3 * x + 2] = std::clamp(r, 0.0, 255.0);
    }
  }
  return horizontal;
}

// The vertical pass: output rows [top, top + out_h) of `cy` from `horizontal` (resample_columns', its first row
// input row y0) into `out` [out_h, out_w, 3], clipped. Each output row adds its taps' rows in order, whole rows at a
// time (each element's sum in the same order as one output at a time, which the compiler vectorizes across the row).
void resample_rows(const std::vector<double>& horizontal, int y0, const Coefficients& cy, int top, int out_h,
                   int out_w, double* out) {
  const size_t width = static_cast<size_t>(out_w) * 3;
  for (int y = 0; y < out_h; ++y) {
    const int o = top + y;
    const double* wk = &cy.weights[static_cast<size_t>(o) * cy.taps];
    double* sum = out + static_cast<size_t>(y) * width;
    std::fill(sum, sum + width, 0.0);
    for (int k = 0; k < cy.taps; ++k) {
      const double* in = &horizontal[static_cast<size_t>(cy.start[o] + k - y0) * width];
      const double weight = wk[k];
      for (size_t i = 0; i < width; ++i) sum[i] += in[i] * weight;
    }
    for (size_t i = 0; i < width; ++i) sum[i] = std::clamp(sum[i], 0.0, 255.0);
  }
}

}  // namespace

std::vector<float> preprocess(const cv::Mat& frame, int size, const Preprocess& p, bool rgb) {
  if (frame.empty() || frame.channels() != 3 || frame.depth() != CV_8U) {
    throw Error("expected a colour uint8 frame [H, W, 3]");
  }
  const int h = frame.rows, w = frame.cols;
  int new_h = size, new_w = size;
  if (p.resize_shorter_side) {
    // torchvision: the shorter side becomes `size`, the longer one int(size * long / short).
    if (h <= w) {
      new_w = static_cast<int>(static_cast<double>(size) * w / h);
    } else {
      new_h = static_cast<int>(static_cast<double>(size) * h / w);
    }
  }
  int top = 0, left = 0, out_h = new_h, out_w = new_w;
  if (p.center_crop) {
    // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
    top = static_cast<int>(std::nearbyint((new_h - size) / 2.0));
    left = static_cast<int>(std::nearbyint((new_w - size) / 2.0));
    out_h = out_w = size;
  }
  // [rows, cols, 3] in double: horizontal pass on the kept columns, then vertical on the kept rows.
  std::vector<double> out(static_cast<size_t>(out_h) * out_w * 3);
  if (new_h == h && new_w == w) {
    for (int y = 0; y < out_h; ++y)
      for (int x = 0; x < out_w; ++x)
        for (int c = 0; c < 3; ++c)
          out[(static_cast<size_t>(y) * out_w + x) * 3 + c] = frame.ptr<cv::Vec3b>(top + y)[left + x][c];
  } else {
    const auto [columns, rows] = cached_coefficients(w, new_w, h, new_h);
    const Coefficients &cx = *columns, &cy = *rows;
    const auto [y0, y1] = input_span(cy, top, out_h);  // the input rows the kept output rows read
    resample_rows(resample_columns(frame, cx, left, out_w, y0, y1), y0, cy, top, out_h, out_w, out.data());
  }
  std::vector<float> chw(static_cast<size_t>(3) * out_h * out_w);
  for (int y = 0; y < out_h; ++y)
    for (int x = 0; x < out_w; ++x)
      for (int c = 0; c < 3; ++c) {  // in RGB order, then (x / 255 - mean) / std in double, as numpy does
        const double value = out[(static_cast<size_t>(y) * out_w + x) * 3 + (rgb ? c : 2 - c)] / 255.0;
        chw[(static_cast<size_t>(c) * out_h + y) * out_w + x] = static_cast<float>((value - p.mean[c]) / p.std[c]);
      }
  return chw;
}

namespace {

// p = sigmoid(cos), what alert thresholds apply to (runtime/queries.py's probabilities).
float sigmoid(double cosine) { return static_cast<float>(1.0 / (1.0 + std::exp(-cosine))); }

}  // namespace

std::vector<float> probabilities(const float* embedding, const QueryTable& q) {
  const size_t count = q.texts.size();
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    double cosine = 0.0;
    for (int e = 0; e < q.dim; ++e) cosine += double(embedding[e]) * q.embeddings[i * q.dim + e];
    out[i] = sigmoid(cosine);
  }
  return out;
}

std::vector<float> probabilities_of(const float* cosines, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = sigmoid(cosines[i]);
  return out;
}

// runtime/sampling.py's END_SLACK_S.
constexpr double kEndSlackS = 1.0;

int64_t samples_served(double stamp, int64_t next_index, double period, double end_time) {
  const double limit = std::min(stamp, end_time);
  int64_t count = 0;
  while (static_cast<double>(next_index + count) * period <= limit + kStampToleranceS) ++count;
  return count;
}

double stated_end_time(double frame_count, double native_fps) {
  if (frame_count > 0 && native_fps > 0) return frame_count / native_fps + kEndSlackS;
  return std::numeric_limits<double>::infinity();
}

namespace {
// A number as Python's f"{x:g}" writes it (0.658041, 1.5, 1e+300), so that both runtimes say the same.
std::string shortest(double value) {
  std::ostringstream words;
  words << value;  // default stream formatting is printf's %g, six significant digits
  return words.str();
}
}  // namespace

void AlertPolicy::validate() const {
  if (!(threshold > 0.0 && threshold < 1.0)) {
    throw Error("threshold " + shortest(threshold) + " is outside (0, 1): it is a probability sigmoid(cos)");
  }
  if (exit_threshold && !(*exit_threshold >= 0.0 && *exit_threshold <= threshold)) {
    throw Error("exit threshold " + shortest(*exit_threshold) + " must lie in [0, threshold " + shortest(threshold) +
                "]: give one at or below the threshold");
  }
  if (!(cooldown_s >= 0.0)) {  // NaN too, as in Python
    throw Error("cooldown " + shortest(cooldown_s) + " s must be a number of seconds, 0 or more");
  }
  if (max_alerts && *max_alerts < 1) {
    throw Error("max alerts " + std::to_string(*max_alerts) + " must be at least 1 (or unset for no limit)");
  }
}

AlertPolicy query_policy(const Bundle& bundle, const std::string& label, std::optional<double> own_threshold,
                         const PolicyOptions& options) {
  AlertPolicy policy;
  const auto labelled = label.empty() ? bundle.label_thresholds.end() : bundle.label_thresholds.find(label);
  policy.threshold = own_threshold      ? *own_threshold
                     : options.threshold ? *options.threshold
                     : labelled != bundle.label_thresholds.end() ? labelled->second
                                                                 : bundle.default_threshold;
  if (options.exit_threshold) {
    policy.exit_threshold = options.exit_threshold;
  } else if (bundle.exit_margin > 0.0) {  // recorded as a margin below the threshold, whichever threshold it is
    policy.exit_threshold = std::max(0.0, policy.threshold - bundle.exit_margin);
  }
  policy.cooldown_s = options.cooldown_s ? *options.cooldown_s : bundle.cooldown_s;
  policy.max_alerts = options.max_alerts;
  return policy;
}

std::string out_of_reach_words(double threshold, const std::string& who) {
  std::ostringstream words;
  words << std::fixed << std::setprecision(4);
  if (threshold >= kHighestScore) {
    words << "is never reached: p = sigmoid(cos) is at most " << kHighestScore << " (a cosine is at most 1), so " << who
          << " never alerts; ";
  } else if (threshold < kLowestScore) {
    words << "is below every score: p = sigmoid(cos) is at least " << kLowestScore << " (a cosine is at least -1), so "
          << who << " alerts at its first frame and never again; ";
  } else {
    return "";
  }
  words << "give one between " << kLowestScore << " and " << kHighestScore
        << " (a calibrated one: sdqes-edge eval --calibrate)";
  return words.str();
}

AlertState::AlertState(AlertPolicy policy) : policy_(std::move(policy)) {
  policy_.validate();
  reset();
}

void AlertState::reset() {
  active_ = false;
  alerts_ = 0;
  last_alert_time_ = -std::numeric_limits<double>::infinity();
}

SavedAlert AlertState::saved(double stream_time) const {
  return {active_, alerts_, stream_time - last_alert_time_};
}

void AlertState::restore(const SavedAlert& saved, double stream_time) {
  active_ = saved.active;
  alerts_ = saved.count;
  last_alert_time_ = stream_time - saved.age_s;
}

// p > threshold compared in float32, as the reference and the Python runtime do: the scores are float32, and
// a probability of exactly float32(threshold) is not above it.
static bool above(double p, double threshold) { return static_cast<float>(p) > static_cast<float>(threshold); }

bool AlertState::update(double p, double stream_time) {
  if (active_) {
    const double exit_level = policy_.exit_threshold ? *policy_.exit_threshold : policy_.threshold;
    if (!above(p, exit_level)) active_ = false;
    return false;
  }
  if (!above(p, policy_.threshold)) return false;
  active_ = true;  // a rising edge; whether it alerts depends on the quiet rules
  if (policy_.max_alerts && alerts_ >= *policy_.max_alerts) return false;
  if (stream_time - last_alert_time_ < policy_.cooldown_s) return false;
  ++alerts_;
  last_alert_time_ = stream_time;
  return true;
}

json AlertEvent::to_json() const {
  return {{"query_id", query_id}, {"query", query}, {"message", message}, {"stream", stream},
          {"stream_time", stream_time}, {"frame_index", frame_index}, {"score", score}, {"cosine", cosine},
          {"latency_ms", latency_ms}, {"threshold", threshold}, {"label", label ? json(*label) : json(nullptr)},
          {"wall_time", wall_time}};
}

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  const size_t length = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + length, sizeof text - length, ".%03dZ", static_cast<int>(millis));
  return text;
}

JsonlSink::JsonlSink(const fs::path& path) : path_(path), file_(std::fopen(path.string().c_str(), "a")) {
  if (!file_) {
    const int failure = errno;
    check_output_path(path, "--events", "alerts.jsonl", /*appended=*/true);  // why, where it can tell (a folder...)
    throw Error("--events " + path.string() + " cannot be written: " + std::strerror(failure));
  }
  use(file_);
}

void JsonlSink::use(std::FILE* file) {
  file_ = file;
  std::setvbuf(file_, nullptr, _IONBF, 0);  // unbuffered: nothing is left to flush once a write failed
  // Bytes up to the end of the last whole line; -1 for anything but a regular file (a pipe, /dev/stdout, /dev/full),
  // which is neither cut nor rotated, as the Python sink's.
  struct stat opened {};
  const bool regular = fstat(fileno(file_), &opened) == 0 && S_ISREG(opened.st_mode);
  whole_ = regular && std::fseek(file_, 0, SEEK_END) == 0 ? std::ftell(file_) : -1;
}

JsonlSink::~JsonlSink() {
  if (file_) std::fclose(file_);
}

// A log rotated under a long stream is followed as the Python sink follows it: moved away (logrotate's default),
// the next alert opens a new file at the path; emptied in place (copytruncate), a line to take back ends where
// the file now does.
void JsonlSink::follow_rotation() {
  if (whole_ < 0) return;  // a pipe is not rotated
  struct stat opened {}, named {};
  if (fstat(fileno(file_), &opened) != 0) return;
  if (stat(path_.string().c_str(), &named) == 0 && named.st_dev == opened.st_dev && named.st_ino == opened.st_ino) {
    if (opened.st_size < whole_) whole_ = static_cast<long>(opened.st_size);
    return;
  }
  std::FILE* replacement = std::fopen(path_.string().c_str(), "a");
  if (!replacement) {  // tried again at the next alert; the alerts go on into the moved file meanwhile
    if (!reopen_refused_) {
      reopen_refused_ = true;
      std::fprintf(stderr, "sdqes-run: warning: the alert log %s was moved away and cannot be made again (%s); "
                   "alerts go on into the moved file\n", path_.string().c_str(), std::strerror(errno));
    }
    return;
  }
  std::fclose(file_);
  use(replacement);
  reopen_refused_ = false;  // a later rotation that fails is said again
}

namespace {

// What to do about a refused alert, by why (as `sdqes-edge run` says them): a disk gone read-only or failing is no
// full disk.
std::string refused_alert_advice(int failure) {
  return failure == ENOSPC || failure == EDQUOT ? "is the disk full? free some space or write to another disk"
         : failure == EFBIG ? "the file is as large as its file system (FAT32: 4 GiB) or `ulimit -f` allows; write to "
                              "another disk"
                            : "see `dmesg` (a disk gone read-only or failing?); write to another disk";
}

}  // namespace

int JsonlSink::append(const std::string& line) {
  int failure = 0;
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    failure = errno;
  } else if (whole_ >= 0 && fsync(fileno(file_)) != 0 && errno != EINVAL) {
    failure = errno;  // not on the disk: taken back too, so that the next try writes it once
  }
  if (failure == 0) {
    if (whole_ >= 0) whole_ = std::ftell(file_);
    return 0;
  }
  if (whole_ >= 0 && ftruncate(fileno(file_), whole_) == 0) std::clearerr(file_);
  return failure;
}

int JsonlSink::write_held() {
  last_try_ = std::chrono::steady_clock::now();
  follow_rotation();
  if (!held_.empty()) {  // one write and one sync; refused in part, all taken back and still held
    std::string lines;
    for (const auto& line : held_) lines += line;
    if (const int failure = append(lines)) return failure;
    held_.clear();
  }
  let_go_ = 0;
  return 0;
}

void JsonlSink::let_go_oldest(size_t keep) {
  for (; held_.size() > keep; held_.pop_front()) ++let_go_;
}

void JsonlSink::write_going_on() {
  const int64_t let_go = let_go_;
  if (const int failure = write_held()) {
    if (!refused_) {
      std::fprintf(stderr, "sdqes-run: warning: cannot append alerts to the alert log %s (%s); the stream goes on "
                   "alerting, its latest %zu alerts held in memory and written with the next alert the disk takes, "
                   "or tried again every %g s\n", path_.string().c_str(), std::strerror(failure), kHeldAlerts,
                   kRetryS);
    }
    refused_ = true;
    return;
  }
  if (refused_) {
    const std::string older = let_go ? " (" + std::to_string(let_go) + " older ones were let go)" : "";
    std::fprintf(stderr, "sdqes-run: note: the alert log %s is written again, the alerts held meanwhile with it%s\n",
                 path_.string().c_str(), older.c_str());
  }
  refused_ = false;
}

void JsonlSink::write(const AlertEvent& event) { write(std::vector<AlertEvent>{event}); }

void JsonlSink::write(const std::vector<AlertEvent>& events) {
  if (events.empty()) return;
  if (whole_ < 0) {  // a pipe or a device (/dev/full): nothing to wait for; its reader gone, the run stops
    std::string text;
    for (const auto& event : events) text += event.to_json().dump() + "\n";
    if (const int failure = append(text)) {
      throw OutputRefused("cannot append an alert to " + path_.string() + " (" + std::strerror(failure) +
                          "): " + refused_alert_advice(failure) + ", and run again");
    }
    return;
  }
  // Held lines exist only while the disk refuses: the oldest go first, never those of this frame untried.
  let_go_oldest(kHeldAlerts > events.size() ? kHeldAlerts - events.size() : 0);
  for (const auto& event : events) held_.push_back(event.to_json().dump() + "\n");
  write_going_on();
  let_go_oldest(kHeldAlerts);  // a frame's alerts more than are held, refused
}

void JsonlSink::retry() {
  if (!held_.empty() &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_try_).count() >= kRetryS) {
    write_going_on();
  }
}

void JsonlSink::finish() {
  if (held_.empty()) return;
  const auto held = static_cast<int64_t>(held_.size()) + let_go_;
  if (const int failure = write_held()) {
    throw OutputRefused("cannot append alerts to " + path_.string() + " (" + std::strerror(failure) + "; " +
                        std::to_string(static_cast<int64_t>(held_.size()) + let_go_) + " of the " +
                        std::to_string(held) + " alerts it refused meanwhile are not in it): " +
                        refused_alert_advice(failure) + ", and run again");
  }
}

QueryTable load_queries(const Bundle& bundle) {
  const json& entry = bundle.manifest.value("queries", json());
  if (entry.is_null()) {
    throw Error(bundle.root.string() + " carries no pre-encoded queries; export it with --query TEXT "
                "(the native runtime has no text encoder)");
  }
  // Row q of the embeddings is the embedding of text q (runtime/bundle.py's Bundle.queries checks the same):
  // files that disagree would hand each text its neighbour's embedding, and alerts would answer other queries.
  const std::string unusable = "the pre-encoded queries of " + bundle.root.string() + " are unusable (";
  const std::string fix = "); re-export it (sdqes-edge export ... --out " + bundle.root.string() + ")";
  QueryTable q;
  std::ifstream texts(inside_bundle(bundle.root, entry.at("file").get<std::string>()));
  const json items = json::parse(texts, nullptr, false);
  const auto is_query = [](const json& item) {
    if (!item.is_object() || !item.contains("text") || !item["text"].is_string()) return false;
    const json threshold = item.value("threshold", json(0.5));
    return item.value("response", json("")).is_string() && item.value("label", json("")).is_string() &&
           threshold.is_number() && !threshold.is_boolean() && threshold.get<double>() > 0.0 &&
           threshold.get<double>() < 1.0;
  };
  if (!items.is_array() || !std::all_of(items.begin(), items.end(), is_query)) {
    throw Error(unusable + "queries.json is not a list of {text, response[, label][, threshold in (0, 1)]} objects" +
                fix);
  }
  for (const json& item : items) {
    q.texts.push_back(item.at("text").get<std::string>());
    q.messages.push_back(item.value("response", q.texts.back()));
    q.labels.push_back(item.value("label", std::string()));
    q.thresholds.push_back(item.contains("threshold") ? std::optional<double>(item.at("threshold").get<double>())
                                                      : std::nullopt);
  }
  if (entry.contains("count") && entry["count"] != json(q.texts.size())) {
    throw Error(unusable + "queries.json holds " + std::to_string(q.texts.size()) + " queries, manifest.json says " +
                entry["count"].dump() + fix);
  }
  // query_embeddings.npy: a little-endian float32 C-order array [Q, E] (numpy's format 1.0 header).
  q.dim = bundle.embed_dim;
  std::ifstream npy(inside_bundle(bundle.root, entry.at("embeddings").get<std::string>()), std::ios::binary);
  char magic[8];
  npy.read(magic, 8);
  uint16_t header_length = 0;
  npy.read(reinterpret_cast<char*>(&header_length), 2);
  std::string header(header_length, ' ');
  npy.read(header.data(), header_length);
  const std::string shape = "(" + std::to_string(q.texts.size()) + ", " + std::to_string(q.dim) + ")";
  if (!npy || std::string(magic + 1, 5) != "NUMPY" || header.find("'<f4'") == std::string::npos ||
      header.find("'fortran_order': False") == std::string::npos ||
      header.find("'shape': " + shape) == std::string::npos) {
    throw Error(unusable + "query_embeddings.npy is not float32 " + shape + ": one embedding per query of "
                "queries.json" + fix);
  }
  q.embeddings.resize(q.texts.size() * static_cast<size_t>(q.dim));
  npy.read(reinterpret_cast<char*>(q.embeddings.data()), static_cast<std::streamsize>(q.embeddings.size() * 4));
  if (!npy) throw Error(unusable + "query_embeddings.npy is truncated" + fix);
  if (!std::all_of(q.embeddings.begin(), q.embeddings.end(), [](float v) { return std::isfinite(v); })) {
    throw Error(unusable + "query_embeddings.npy holds NaN or infinite values" + fix);
  }
  return q;
}

namespace {
constexpr std::array<int, 3> kStopSignals{SIGINT, SIGTERM, SIGHUP};
volatile std::sig_atomic_t stop_signal = 0;  // written only by the handler below

void ask_to_stop(int signum) {
  if (stop_signal != 0) {  // the second signal: stop now, as the default action would
    std::signal(signum, SIG_DFL);
    std::raise(signum);
    return;
  }
  stop_signal = signum;
}
}  // namespace

StopOnSignal::StopOnSignal() {
  stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = ask_to_stop;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &action, &previous_[i]);
}

StopOnSignal::~StopOnSignal() {
  for (size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &previous_[i], nullptr);
}

bool StopOnSignal::requested() const { return stop_signal != 0; }

int StopOnSignal::signal_number() const { return stop_signal; }

std::string StopOnSignal::signal_name() const {
  switch (stop_signal) {
    case 0: return "";
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(stop_signal);
  }
}

int StopOnSignal::exit_code() const { return stop_signal == 0 ? 0 : 128 + stop_signal; }

}  // namespace sdqes
