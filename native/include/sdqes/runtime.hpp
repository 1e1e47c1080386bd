// sdqes native runtime: the C++ side of the bundle contract (DESIGN.md section 3).
//
// Reads the bundle the Python exporter writes, validates it exactly as runtime/bundle.py does, and
// reproduces the Python runtime's preprocessing, scoring and alert policy, so a robot without
// Python behaves like `sdqes-edge run`. Shared test vectors (tests/vectors/) keep the two in step.
#pragma once

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

namespace sdqes {

// A problem with the user's input: printed as one line, never a crash.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An output the machine refused (a full disk, a quota): the machine's state, which may mend, so sdqes-run ends with
// exit status 1, as `sdqes-edge run` does, not a mistaken command's 2.
struct OutputRefused : Error {
  using Error::Error;
};

constexpr int kBundleFormatVersion = 2;  // sdqes_edge/contract.py BUNDLE_FORMAT_VERSION (tested)
constexpr const char* kBundleFormat = "sdqes-edge-bundle";
constexpr const char* kStateInputPrefix = "state_in.";
constexpr const char* kStateOutputPrefix = "state_out.";
// The fastest rate a bundle samples at, frames per second (sdqes_edge/contract.py MAX_FPS; tested): a manifest's fps
// of 1e300 stepped a file's first frame without end, one of 0 streamed nothing and said done, -1 never began.
constexpr double kMaxFps = 1000.0;
// Every score is p = sigmoid(cos) and a cosine lies in [-1, 1], so p lies in [sigmoid(-1), sigmoid(1)]
// (sdqes_edge/contract.py SCORE_RANGE; tested): a --threshold at or above the top is never reached.
constexpr double kLowestScore = 0.2689414213699951;
constexpr double kHighestScore = 0.7310585786300049;
// Why a threshold at or above every score leaves `who` silent, or one below every score makes it alert at its first
// frame alone, and what to give; "" for one between them. In the words of runtime/alerts.py's never_reached_words and
// below_every_score_words.
std::string out_of_reach_words(double threshold, const std::string& who);
// The metadata_props key a step graph's JSON description lives under, and the manifest fields that description
// fixes (sdqes_edge/contract.py METADATA_KEY, runtime/bundle.py DESCRIBED_BY_THE_GRAPH; tested).
constexpr const char* kMetadataKey = "sdqes_edge";
constexpr const char* kDescribedByTheGraph[] = {"image_size", "embed_dim", "batch", "query_count", "preprocess"};

// A step graph exported with --fuse-queries also takes the queries' embeddings [Q, E] and gives their cosines
// [B, Q] (sdqes_edge/contract.py QUERY_INPUT, LOGITS_OUTPUT; tested). ONNX Runtime's backend feeds them; a TensorRT
// engine is never built from such a graph (sdqes-edge build-engine refuses it), and one made otherwise is refused.
constexpr const char* kQueryInput = "query_embeddings";
constexpr const char* kLogitsOutput = "logits";

struct StateTensor {
  std::string name;               // where it lives, e.g. "block03.adapter1.qrnn0_h"
  std::vector<int64_t> shape;     // batch first
  std::string dtype = "float32";
  float initial_value = 0.0f;

  int64_t elements() const;
  size_t bytes() const { return static_cast<size_t>(elements()) * sizeof(float); }
  std::string input_name() const { return kStateInputPrefix + name; }
  std::string output_name() const { return kStateOutputPrefix + name; }
};

struct Preprocess {
  std::array<double, 3> mean{};  // double, as the Python runtime normalizes in float64
  std::array<double, 3> std{};
  bool resize_shorter_side = true;
  bool center_crop = true;
};

struct Bundle {
  std::filesystem::path root;
  nlohmann::json manifest;
  int image_size = 0;
  int embed_dim = 0;
  int batch = 1;
  double fps = 1.0;
  double default_threshold = 0.5;
  // Recorded by `sdqes-edge eval --calibrate --per-label --calibrate-policy --write-threshold`: a threshold per query
  // label, and the alert policy as a margin below the threshold (0: none) and a cooldown.
  std::map<std::string, double> label_thresholds;
  double exit_margin = 0.0;
  double cooldown_s = 0.0;
  Preprocess preprocess;
  std::vector<StateTensor> state;

  std::vector<std::string> precisions() const;
  std::filesystem::path step_graph(const std::string& precision) const;
};

// Opens and validates a bundle directory (schema, format version, listed files, sha256, state wiring).
Bundle load_bundle(const std::filesystem::path& root, bool verify_hashes = true);

// What a bundle's model was trained on, in words (train_options.py's training_data_words), from the record
// `sdqes-edge train` wrote and `export` put in the bundle (training_record.json): "synthetic scenes (...), N training
// streams", which `sdqes-run` notes as `sdqes-edge run` does; "" where there is no record or it does not say so. The
// record is someone else's data: one that says less, or says it otherwise, says nothing.
std::string training_data_words(const nlohmann::json& record);
std::string training_data_words(const Bundle& bundle);
// What a bundle exported from a preset (`export --preset`: its weights drawn at random, to measure speed) says of its
// weights (train_options.py's random_weights_words): "random weights (exported from preset P, seed S, to measure
// speed)"; "" where the manifest does not say so. Its scores and alerts mean nothing, which both runtimes warn of.
std::string random_weights_words(const nlohmann::json& manifest);
// The warning a run gives of such a bundle, `words` being random_weights_words' (the Python runtime's, word for word).
std::string random_weights_warning(const std::string& words);
std::string sha256_file(const std::filesystem::path& path);
// The model a bundle holds, whatever precision runs: the sha256 of its fp32 step graph, as runtime/bundle.py's
// model_identity (what a state snapshot is tied to); "" for a bundle without an fp32 graph.
std::string model_identity(const Bundle& bundle);
// An ONNX graph's metadata_props (key -> value), read from the protobuf wire format without reading the graph
// itself (skipped by its length); an Error when the file is not protobuf.
std::map<std::string, std::string> metadata_props(const std::filesystem::path& graph);
// root / name, or an Error when name is absolute, contains "..", or resolves (symlinks followed) outside root.
// named_by_manifest: false for the names the runtime looks for itself (the manifest, engines and their sidecars),
// which only a symlink can lead out; the error then says so.
std::filesystem::path inside_bundle(const std::filesystem::path& root, const std::string& name,
                                    bool named_by_manifest = true);
std::vector<StateTensor> parse_state_spec(const nlohmann::json& items);

// The manifest's "thresholds" into b (default, per label, recorded policy); an Error names what is malformed.
void parse_thresholds(const nlohmann::json& thresholds, Bundle& b);

// Pre-encoded queries shipped in the bundle: texts, alert messages, labels ("" for none), thresholds of their own
// and embeddings [Q, E].
struct QueryTable {
  std::vector<std::string> texts, messages, labels;
  std::vector<std::optional<double>> thresholds;
  std::vector<float> embeddings;  // row-major [Q, E]
  int dim = 0;
};
QueryTable load_queries(const Bundle& bundle);

// runtime/sampling.py's STAMP_TOLERANCE_S: a container's millisecond stamps may land a hair below a sample time.
inline constexpr double kStampToleranceS = 1e-6;

// How many sample times k * period (k >= next_index) a file's frame at `stamp` seconds serves as the first frame at
// or after them: 0, 1, or more where the video is slower than the samples (the frame is repeated, so stream time
// stays true). No sample time past `end_time` (the file's stated length plus slack; infinity: not stated).
// As runtime/sampling.py does; tests/vectors/sampling.json holds both to it.
int64_t samples_served(double stamp, int64_t next_index, double period,
                       double end_time = std::numeric_limits<double>::infinity());
// The file's stated length plus slack (sampling.stated_end_time), or infinity where the container does not say.
double stated_end_time(double frame_count, double native_fps);

// What a source is called in alerts (the JSONL `stream`) and messages, as the Python runtime calls it
// (tests/vectors/source_names.json): a camera "camera0"; a camera's device file, a stream URL or a GStreamer
// pipeline by runtime/live_source.py's live_source_name (the URL's host, port, path and query, never its
// password); a video file by its stem (runtime/sources.py's video_file_name). And a URL as messages show it, its
// password as "***".
std::string camera_name(int index);
std::string live_source_name(const std::string& target);
std::string video_file_name(const std::string& location);
std::string without_password(const std::string& url);
// A line for a terminal with each control character (C0 but the tab, DEL, C1) written as its Python escape (\x1b,
// \r), as sdqes_edge/errors.py's terminal_safe writes it: a bundle's alert message is someone else's data, and one of
// "\x1b[2K\rFAKE" erased the alert's line on the terminal and wrote another.
std::string terminal_safe(const std::string& line);
bool is_gstreamer_pipeline(const std::string& target);
// A URL, which OpenCV's FFmpeg opens (RTSP, HTTP(S), UDP, TCP): opened with timeouts of kStreamTimeoutS or
// --stream-timeout (runtime/live_source.py's is_stream_url; tests/vectors/source_kinds.json).
bool is_stream_url(const std::string& target);
// How long OpenCV's FFmpeg may wait for a stream URL to open, or for its next frame (its own default: 30 s, so a
// stream that stalled was reconnected only 30 s on): runtime/frame_source.py's STREAM_TIMEOUT_S; sdqes-run
// --stream-timeout sets it, kStreamTimeoutMinS at least (FFmpeg counts it in milliseconds).
inline constexpr double kStreamTimeoutS = 10.0;
inline constexpr double kStreamTimeoutMinS = 0.1;
// sdqes-run's --source other than a camera index: a live one (an RTSP/UDP/TCP URL, a pipeline, a camera's device
// file: source_kind) by live_source_name, anything else by video_file_name (an HTTP(S) URL until it is opened: one
// whose container counts no frames is a live stream, named by live_source_name).
std::string source_name(const std::string& source);
// Several sources named alike (two videos called clip.mp4 in different folders) renamed clip, clip-2, ... as
// runtime/sources.py's give_distinct_names renames them: alerts and --state files are named after their source.
// -> the names given (empty: none clashed).
std::vector<std::string> give_distinct_names(std::vector<std::string>& names);
// What a --source names, before anything is opened, as runtime/sources.py's source_kind decides
// (tests/vectors/source_kinds.json): "camera" (an index), "web" (an HTTP(S) URL: a live stream or a video file,
// told apart once opened by whether its container counts frames), "stream" (an RTSP/UDP/TCP URL, a GStreamer
// pipeline that names no file), "missing camera" (a path under /dev that is not there), "missing", "folder",
// "device" (a camera by its device file) or "file".
std::string source_kind(const std::string& source);
// Whether a source of `kind` is read live (a camera, a device file, a stream); "web" is once its container counts no
// frames, which only opening it tells.
bool is_live_kind(const std::string& kind);

// The back-off between attempts to reopen a live source (a camera, a stream) that stopped sending frames; after
// the last, it gives up (runtime/live_source.py's RECONNECT_DELAYS_S, tests/vectors/source_kinds.json).
const std::vector<double>& reconnect_delays_s();
// Reopens a live source that stopped sending frames, as the Python runtime's LiveSource does: before each attempt
// `log` says so ("NAME: no frame; reconnecting in 0.5 s (attempt 1 of 5)") and `wait` waits its delay (false: the
// run was asked to stop meanwhile); `open` tries once, after each of `delays` in turn. Where given `keep_trying` (a
// camera of several, which the others keep running), it is not given up once they are spent: `spent` is called, that
// is said, and it goes on trying every last delay for as long as keep_trying() says (another camera still sends).
// -> the attempt that reopened it, or 0 (gave up, or stopped).
int reconnect(const std::string& name, const std::function<bool()>& open, const std::function<bool(double)>& wait,
              const std::function<void(const std::string&)>& log,
              const std::vector<double>& delays = reconnect_delays_s(), const std::function<bool()>& keep_trying = {},
              const std::function<void()>& spent = {});

// One uint8 frame, BGR as OpenCV decodes it (or RGB where `rgb`: a ROS 2 rgb8 image, most SDKs) -> normalized
// float32 [3, R, R] (CHW), as runtime/preprocess.py does.
std::vector<float> preprocess(const cv::Mat& frame, int image_size, const Preprocess& p, bool rgb = false);

// p = sigmoid(cos) for embedding [E] against queries [Q, E].
std::vector<float> probabilities(const float* embedding, const QueryTable& queries);
// p = sigmoid(cos) for `count` cosines (a graph that scores its queries itself gives them: its logits).
std::vector<float> probabilities_of(const float* cosines, size_t count);

struct AlertPolicy {
  double threshold = 0.5;
  std::optional<double> exit_threshold;  // hysteresis
  double cooldown_s = 0.0;
  std::optional<int> max_alerts;
  void validate() const;
};

// What sdqes-run's options set; unset: the bundle's.
struct PolicyOptions {
  std::optional<double> threshold, exit_threshold, cooldown_s;
  std::optional<int> max_alerts;
};

// A query's policy as the Python runtime decides it (runtime/bundle.py's Bundle.policy_for;
// tests/vectors/query_policies.json): its own threshold, else the option's, else the bundle's for its label, else
// the default; the exit threshold and cooldown given, else those recorded.
AlertPolicy query_policy(const Bundle& bundle, const std::string& label, std::optional<double> own_threshold,
                         const PolicyOptions& options);

// The rising-edge rule with hysteresis, cooldown and max-k, frame by frame (runtime/alerts.py).
// Now as ISO 8601 in UTC, to the millisecond ("2026-11-27T22:10:03.123Z"): an alert's wall_time.
std::string utc_timestamp();

// What a restart keeps of a query's alert state (runtime/snapshots.py's SavedAlert): inside a run above threshold,
// alerts raised (max_alerts), seconds from the last alert to the stream time it was saved at (cooldown; infinity:
// none yet).
struct SavedAlert {
  bool active = false;
  int count = 0;
  double age_s = std::numeric_limits<double>::infinity();
};

class AlertState {
 public:
  explicit AlertState(AlertPolicy policy);
  bool update(double p, double stream_time);
  void reset();
  const AlertPolicy& policy() const { return policy_; }
  SavedAlert saved(double stream_time) const;
  // As saved, at `stream_time` of the run that goes on (a restarted run's stream time begins again at 0).
  void restore(const SavedAlert& saved, double stream_time);

 private:
  AlertPolicy policy_;
  bool active_ = false;
  int alerts_ = 0;
  double last_alert_time_;
};

struct AlertEvent {
  std::string query_id, query, message, stream;
  double stream_time = 0.0;
  int64_t frame_index = 0;
  double score = 0.0, cosine = 0.0, latency_ms = 0.0;
  // The query's policy threshold that p rose above, and its label (none: written null), as the Python log has them.
  double threshold = 0.0;
  std::optional<std::string> label;
  std::string wall_time = utc_timestamp();  // when the alert was raised, UTC, as the Python runtime writes it
  nlohmann::json to_json() const;
};

// Appends one JSON object per line, flushed and synced per event (a crash loses nothing alerted). A line the disk
// refuses part of (full, a quota) is taken back, so the log holds whole lines only, as the Python sink's does. While
// the stream goes on, alerts the disk refuses are said once on stderr, held (the latest kHeldAlerts, the oldest let go
// and counted) and written in order with the next alert it takes, or by `retry` every kRetryS between alerts, and
// that is said too; `finish` raises an OutputRefused naming the file for those still refused as the stream ends
// (runtime/alert_log.py's JsonlSink, in its words). A pipe (/dev/stdout) is written line by line, not synced, and a
// refusal there is raised at once. A log rotated under it is followed (a new file at the path once the old one is
// moved away), as the Python sink follows one.
class JsonlSink {
 public:
  static constexpr size_t kHeldAlerts = 10000;  // the Python sink's HELD_ALERTS
  static constexpr double kRetryS = 30.0;       // its RETRY_SECONDS

  explicit JsonlSink(const std::filesystem::path& path);
  ~JsonlSink();
  JsonlSink(const JsonlSink&) = delete;
  JsonlSink& operator=(const JsonlSink&) = delete;
  void write(const AlertEvent& event);
  // A frame's alerts of a stream, in one write and one sync: a hundred queries alerting at a stream's first frame had
  // cost a hundred syncs (tens of ms each on a Jetson's SD card), the camera's frames dropped meanwhile.
  void write(const std::vector<AlertEvent>& events);
  void retry();   // per frame: the alerts held tried again once kRetryS have passed since the last try
  void finish();  // the alerts held written, or an OutputRefused naming the log and the alerts it lost

 private:
  void use(std::FILE* file);
  void follow_rotation();
  int append(const std::string& line);  // 0, or the errno of a refusal (the part written taken back)
  int write_held();                     // 0, or the errno of a refusal (every held line still held)
  void let_go_oldest(size_t keep);      // held lines past `keep` let go, oldest first, and counted
  void write_going_on();                // write_held, its refusal said once, not raised
  std::filesystem::path path_;
  std::FILE* file_;
  long whole_ = -1;  // bytes up to the end of the last whole line; -1 for a pipe, which cannot be cut
  bool reopen_refused_ = false;  // said once: a rotated log could not be made again at the path
  std::deque<std::string> held_;  // lines the disk refused, oldest first
  int64_t let_go_ = 0;            // held lines let go past kHeldAlerts since the disk last took the log
  bool refused_ = false;          // the last try was refused: said once, until a try succeeds
  std::chrono::steady_clock::time_point last_try_ = std::chrono::steady_clock::now();
};

// While one lives, SIGINT, SIGTERM and SIGHUP ask a stream's loop to stop after the frame in hand (sinks are never
// cut mid-write); a second signal ends the process at once (a loop stuck on a dead camera must still stop). The
// handlers before it are put back when it goes. The exit status is 128 + the signal, as shells report it; the
// Python runtime's `FinishFrameThenStop` behaves the same. One at a time per process.
class StopOnSignal {
 public:
  StopOnSignal();
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  bool requested() const;
  int signal_number() const;        // 0 until a signal arrives
  std::string signal_name() const;  // "SIGTERM" (empty until a signal arrives)
  int exit_code() const;            // 0, or 128 + the signal

 private:
  std::array<struct sigaction, 3> previous_{};
};

// Sleeps `seconds` unless `stop` is requested meanwhile (looked at every 50 ms) -> false when it was: a stream's
// loop waiting to reconnect a camera still stops at once for Ctrl-C or `docker stop`.
bool wait_unless_stopped(double seconds, const StopOnSignal& stop);

// The engine for `precision` under engines/<device>/ (any device when `device_folder` is empty).
std::filesystem::path find_engine(const Bundle& bundle, const std::string& precision,
                                  const std::string& device_folder = "");

// What an engine must have been built for, as build-engine's JSON sidecar records it: engines are specific to
// the GPU architecture and the TensorRT version.
struct EngineTarget {
  int cc_major = 0;
  int cc_minor = 0;
  std::string tensorrt_version;  // "major.minor.patch[.build]"; major.minor.patch must match the sidecar's
};

// The `precision` engine whose sidecar records `target`, among every device folder of engines/; otherwise an
// error naming what the bundle has and the command that builds the right one on this device.
std::filesystem::path find_engine(const Bundle& bundle, const std::string& precision, const EngineTarget& target);

}  // namespace sdqes
