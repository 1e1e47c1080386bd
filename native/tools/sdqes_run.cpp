// sdqes-run: `sdqes-edge run` for C++ robots, on a bundle's TensorRT engine, or its ONNX graph on the CPU.
//   sdqes-run BUNDLE --source VIDEO|CAMERA|URL [--backend tensorrt|onnxruntime] [--precision fp16] [--threshold X]
//             [--exit-threshold X] [--cooldown S] [--max-alerts K] [--events FILE] [--state FILE] [--max-frames N]
// Queries come pre-encoded in the bundle (sdqes-edge export --query ...). A user's mistake is one line on
// stderr and exit code 2; a camera or stream that cannot be opened, or that stopped sending frames and did not
// come back, exit code 1 (the machine's state: a service manager starts the run again), as `sdqes-edge run`.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <opencv2/videoio.hpp>

#include "sdqes/alert_state_file.hpp"
#include "sdqes/live_reader.hpp"
#include "sdqes/runtime.hpp"
#include "sdqes/service_manager.hpp"
#include "sdqes/step_backend.hpp"
#if defined(SDQES_WITH_TENSORRT) || defined(SDQES_WITH_ONNXRUNTIME)
#define SDQES_CAN_STREAM 1  // a backend to step the graph on: the streaming loop is built
#endif

namespace {

const char* kUsage =
    "usage: sdqes-run BUNDLE --source VIDEO|CAMERA|URL [--backend tensorrt|onnxruntime] [--precision fp16|fp32|int8]\n"
    "                 [--threshold X] [--exit-threshold X] [--cooldown S] [--max-alerts K] [--events FILE]\n"
    "                 [--state FILE] [--max-frames N] [--threads N]\n"
    "--backend: tensorrt steps the bundle's engine for this GPU (sdqes-edge build-engine); onnxruntime steps its\n"
    "ONNX graph on the CPU. The default is the first this sdqes-run was built with. --precision: fp16 on TensorRT,\n"
    "fp32 on ONNX Runtime unless given. --threads: ONNX Runtime's threads (default: one per core).\n"
    "--state FILE keeps each query's alert state across a restart (--max-alerts, hysteresis, cooldown): read at the\n"
    "start where it exists, written after an alert (at most every 5 s) and when the stream ends or is stopped.\n";

std::map<std::string, std::string> parse(int argc, char** argv, std::string& bundle) {
  std::map<std::string, std::string> options;
  const std::map<std::string, bool> known{{"--source", true}, {"--precision", true}, {"--threshold", true},
                                          {"--exit-threshold", true}, {"--cooldown", true}, {"--max-alerts", true},
                                          {"--events", true}, {"--state", true}, {"--max-frames", true},
                                          {"--backend", true}, {"--threads", true}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg.rfind("--", 0) == 0) {
      if (!known.count(arg)) throw sdqes::Error("unknown option " + arg + " (see sdqes-run --help)");
      if (i + 1 >= argc) throw sdqes::Error(arg + " needs a value");
      options[arg] = argv[++i];
    } else if (bundle.empty()) {
      bundle = arg;
    } else {
      throw sdqes::Error("unexpected argument " + arg + " (see sdqes-run --help)");
    }
  }
  if (bundle.empty()) throw sdqes::Error("give the bundle directory (see sdqes-run --help)");
  if (!options.count("--source")) {
    throw sdqes::Error("give --source VIDEO, a camera (its index or device file) or a stream URL");
  }
  return options;
}

// A number given on the command line, read whole: std::stod alone takes "0.5x" as 0.5 and "nan" as NaN, and a
// NaN passes every range check after it.
double real_number(const std::map<std::string, std::string>& o, const std::string& key, double fallback) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != it->second.size() || !std::isfinite(value)) {
    throw sdqes::Error(key + " needs a finite number, not '" + it->second + "'");
  }
  return value;
}

// A whole number of at least `minimum`: "0", "-3" and "2.5" were taken, and a max-frames of 0 or less streamed
// to the end without a word.
int64_t whole_number(const std::string& key, const std::string& text, int64_t minimum) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < minimum) {
    throw sdqes::Error(key + " needs a whole number of at least " + std::to_string(minimum) + ", not '" + text +
                       "'");
  }
  return value;
}

// A camera or stream that cannot be opened, or stopped sending frames for good: exit status 1, not 2.
struct SourceUnavailable : sdqes::Error {
  using sdqes::Error::Error;
};

// What --source is, read as `sdqes-edge run` reads it (sdqes::source_kind): live (a camera by its index or device
// file, a stream URL or pipeline; an HTTP(S) URL once its container counts no frames) is stamped by the wall
// clock, each frame stepped once, and reopened with back-off when it drops; a file is stamped by its container.
struct Source {
  std::string spec, kind, shown;  // shown: a URL without its password
  int camera_index = -1;

  bool open(cv::VideoCapture& capture) const {
    capture.release();
    return kind == "camera" ? capture.open(camera_index) : capture.open(spec);
  }
};

Source read_source(const std::string& spec) {
  Source source{spec, sdqes::source_kind(spec), sdqes::without_password(spec)};
  if (source.kind == "camera") {
    source.camera_index = static_cast<int>(std::min<int64_t>(whole_number("--source", spec, 0),
                                                             std::numeric_limits<int>::max()));
  } else if (source.kind == "missing") {
    throw sdqes::Error("--source " + source.shown + " is neither a video file, a camera index nor a stream URL");
  } else if (source.kind == "missing camera") {
    throw SourceUnavailable("no camera at " + spec + "; check it is connected (ls /dev/video*)");
  } else if (source.kind == "folder") {
    throw sdqes::Error("--source " + spec + " is a folder; sdqes-run reads a video, a camera or a stream "
                       "(sdqes-edge run streams a folder of images)");
  }
  return source;
}

#ifdef SDQES_CAN_STREAM
// A video file's sampled frames, read on the loop's thread: every sample time is stepped, none dropped.
class FileFrames {
 public:
  FileFrames(cv::VideoCapture& capture, double period)
      : capture_(capture),
        period_(period),
        end_time_(sdqes::stated_end_time(capture.get(cv::CAP_PROP_FRAME_COUNT), capture.get(cv::CAP_PROP_FPS))) {}

  // The next sampled frame and how many sample times k / fps it serves, each by the first frame at or after it
  // (runtime/sampling.py): more than one where the video is slower than the bundle, its frame repeated.
  // -> false at the file's end, or a frame that would not decode.
  bool next(cv::Mat& image, int64_t& serves) {
    while (capture_.grab()) {
      const double stamp = capture_.get(cv::CAP_PROP_POS_MSEC) / 1000.0;
      serves = sdqes::samples_served(stamp, next_sample_, period_, end_time_);
      if (serves == 0) continue;  // between two sample times: not decoded
      next_sample_ += serves;
      return capture_.retrieve(image) && !image.empty();
    }
    return false;
  }

 private:
  cv::VideoCapture& capture_;
  double period_, end_time_;
  int64_t next_sample_ = 0;  // the first sample time k / fps not yet served
};

// A live source's VideoCapture as the reader thread reads it: every frame grabbed, only a sampled one decoded.
std::shared_ptr<sdqes::LiveCapture> live_capture(const std::shared_ptr<cv::VideoCapture>& video, const Source& source) {
  auto capture = std::make_shared<sdqes::LiveCapture>();
  capture->grab = [video] { return video->grab(); };
  capture->retrieve = [video](cv::Mat& image) { return video->retrieve(image); };
  capture->reopen = [video, source] { return source.open(*video); };
  return capture;
}

void say(const std::string& line) { std::cerr << "sdqes-run: " << line << std::endl; }

// Steps the engine and raises the queries' alerts, each written to the JSONL sink (when there is one) and printed.
struct Alerting {
  const sdqes::OpenedStep& engine;
  const sdqes::QueryTable& queries;
  std::vector<sdqes::AlertState>& states;
  sdqes::JsonlSink* sink;
  std::string stream_name;
  int64_t stepped = 0;  // frames stepped so far: the next one's index
  int64_t raised = 0;   // alerts raised so far
  double last_time = 0.0;  // the last step's stream time

  // One step on `batch` at stream time `time`; latency counted from `since`, when its frame was in hand.
  void step_at(const std::vector<float>& batch, double time, std::chrono::steady_clock::time_point since) {
    last_time = time;
    const auto& embedding = engine.backend->step(batch);
    const auto probs = sdqes::query_probabilities(*engine.backend, embedding, queries);
    const double latency = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
    for (size_t q = 0; q < probs.size(); ++q) {
      if (!std::isfinite(probs[q])) throw sdqes::Error("the model produced a non-finite score; stopping the stream");
      if (!states[q].update(probs[q], time)) continue;
      sdqes::AlertEvent e{"q" + std::to_string(q + 1), queries.texts[q], queries.messages[q], stream_name, time,
                          stepped, probs[q], std::log(probs[q] / (1 - probs[q])), latency,
                          states[q].policy().threshold,
                          queries.labels[q].empty() ? std::nullopt : std::optional<std::string>(queries.labels[q])};
      if (sink) sink->write(e);  // first: a closed stdout (`| head`) ends the process by SIGPIPE at the print
      std::cout << "[" << time << " s] " << e.message << "  (p=" << e.score << ")" << std::endl;
      ++raised;
    }
    ++stepped;
  }
};

// --state: each query's alert state written after an alert (at most every kAlertStateEveryS, so that a power cut or a
// kill keeps each alert's count and time) and when the stream ends or is stopped.
struct StateSaver {
  const sdqes::AlertStateFile* file;
  const sdqes::QueryTable& queries;
  const std::vector<sdqes::AlertState>& states;
  int64_t saved_raised = 0;  // alerts raised when it was last written
  std::chrono::steady_clock::time_point saved_at = std::chrono::steady_clock::time_point::min();

  void after_frame(const Alerting& alerting) {
    if (file == nullptr || alerting.raised == saved_raised) return;
    const auto now = std::chrono::steady_clock::now();
    if (saved_at != std::chrono::steady_clock::time_point::min() &&
        std::chrono::duration<double>(now - saved_at).count() < sdqes::kAlertStateEveryS) {
      return;  // written at the next frame past the interval
    }
    if (save(alerting.last_time)) saved_raised = alerting.raised;
    saved_at = now;
  }

  // -> whether it was written; a failure is said and the stream goes on (its alerts matter more than the file).
  bool save(double stream_time) const {
    if (file == nullptr) return false;
    try {
      file->save(queries, states, stream_time);
      return true;
    } catch (const sdqes::Error& e) {
      std::cerr << "sdqes-run: warning: " << e.what() << std::endl;
      return false;
    }
  }
};

// How often `systemctl status` hears how the run is doing: one datagram, so as often as a terminal's status line.
constexpr std::chrono::seconds kStatusEvery{5};

// "29.8 frames/s, dropped 0, 1 alert": `systemctl status`'s line, `sdqes-edge run`'s without its latency percentiles.
std::string status_line(const Alerting& alerting, double seconds, int64_t dropped) {
  std::ostringstream line;
  line << std::fixed << std::setprecision(1) << (seconds > 0 ? alerting.stepped / seconds : 0.0)
       << " frames/s, dropped " << dropped << ", " << alerting.raised << (alerting.raised == 1 ? " alert" : " alerts");
  return line.str();
}

// The run's last line on stderr, and its exit status: 128 + a signal; 1 for a live source lost for good (a failure,
// so a service manager starts the run again); else 0.
int report_end(const sdqes::StopOnSignal& stop, const std::string& stream_name, int64_t index, int64_t dropped,
               bool lost) {
  const std::string dropped_words =
      dropped ? ", " + std::to_string(dropped) + " frames dropped (the engine is slower than the source)" : "";
  if (stop.requested()) {
    std::cerr << "sdqes-run: interrupted (" << stop.signal_name() << ") after " << index << " frames"
              << dropped_words << std::endl;
    return stop.exit_code();
  }
  if (lost) {  // a live source never ends: it went away; a failure, so a service manager starts the run again
    const size_t attempts = sdqes::reconnect_delays_s().size();
    std::cerr << "sdqes-run: error: " << stream_name << " stopped sending frames and did not come back after "
              << attempts << " reconnection attempts: the stream ended there after " << index
              << " frames, every output complete (exit status 1)" << std::endl;
    return 1;
  }
  std::cerr << "done: " << index << " frames" << dropped_words << std::endl;
  return 0;
}

// The source opened, whether it is read live, and what alerts call it (the JSONL `stream`, as `sdqes-edge run` calls
// it; a URL's password never shown).
struct OpenSource {
  std::shared_ptr<cv::VideoCapture> video;
  bool live;
  std::string name;
};

OpenSource open_source(const Source& source) {
  auto video = std::make_shared<cv::VideoCapture>();
  if (!source.open(*video)) {
    if (source.kind == "file") throw sdqes::Error("OpenCV cannot open " + source.shown + "; check the file plays");
    throw SourceUnavailable("OpenCV cannot open " + source.shown + "; check the camera is connected, or that the "
                            "URL plays from this machine");
  }
  const bool live = sdqes::is_live_kind(source.kind) ||
                    (source.kind == "web" && !(video->get(cv::CAP_PROP_FRAME_COUNT) > 0));
  const std::string name = source.kind == "camera" ? sdqes::camera_name(source.camera_index)
                           : live                  ? sdqes::live_source_name(source.spec)
                                                   : sdqes::video_file_name(source.spec);
  return {video, live, name};
}

// Steps the engine on the source's frames and raises the queries' alerts until the source ends, --max-frames, or a
// signal. A live source is read on a thread of its own (sdqes::LiveReader), stamped by the wall clock: the loop
// always steps on its newest sampled frame, each once, and counts the ones it had no time for as dropped.
int stream(const sdqes::Bundle& bundle, const sdqes::QueryTable& queries, std::vector<sdqes::AlertState>& states,
           const Source& source, const sdqes::OpenedStep& engine, int64_t max_frames, const std::string& events,
           const sdqes::AlertStateFile* state_file) {
  const OpenSource opened = open_source(source);
  const auto& [video, live, stream_name] = opened;
  if (state_file) state_file->restore(queries, states, say);
  std::unique_ptr<sdqes::JsonlSink> sink;
  if (!events.empty()) sink = std::make_unique<sdqes::JsonlSink>(events);
  const double period = 1.0 / bundle.fps;
  const double native_fps = live ? 0.0 : video->get(cv::CAP_PROP_FPS);
  if (native_fps > 0 && native_fps < bundle.fps) {
    std::cerr << "sdqes-run: note: " << source.shown << " has " << native_fps << " frames per second, fewer than the "
              << bundle.fps << " the bundle samples: each frame is repeated for the sample times it covers"
              << std::endl;
  }
  const sdqes::StopOnSignal stop;  // Ctrl-C, docker stop, systemd: the frame in hand is finished, then the loop ends
  std::optional<FileFrames> file;
  std::unique_ptr<sdqes::LiveReader> reader;  // its clock starts here, after the warm-up
  if (live) {
    reader = std::make_unique<sdqes::LiveReader>(live_capture(video, source), stream_name, period, say);
  } else {
    file.emplace(*video, period);
  }
  // The next frame, when it was taken (a live frame's), and how many sample times it is stepped for.
  const auto next = [&](cv::Mat& image, double& stamp, int64_t& serves) {
    if (file) return file->next(image, serves);
    sdqes::LatestFrame::Frame frame;
    if (!reader->frames().take(frame, [&stop] { return stop.requested(); })) return false;
    image = frame.image;
    stamp = frame.stamp;
    serves = 1;  // a live frame steps once: repeating a stale frame would put the model behind the world
    return true;
  };
  std::ostringstream header;  // as `sdqes-edge run` starts: what streams, how fast, what is asked, on what
  header << "streaming " << stream_name << " at " << bundle.fps << " fps with " << queries.texts.size()
         << (queries.texts.size() == 1 ? " query" : " queries") << " (" << engine.words << ")";
  std::cerr << "sdqes-run: " << header.str() << (live ? "; Ctrl-C to stop" : "") << std::endl;
  sdqes::ServiceManager manager;  // systemd's Type=notify: ready now, a watchdog ping per frame, stopping at the end
  manager.ready(header.str());
  Alerting alerting{engine, queries, states, sink.get(), stream_name};
  StateSaver saver{state_file, queries, states};
  const auto started = std::chrono::steady_clock::now();
  auto reported = started;
  cv::Mat image;
  double stamp = 0.0;
  int64_t serves = 0;
  bool enough = false;
  while (!enough && !stop.requested() && next(image, stamp, serves)) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> batch = sdqes::preprocess(image, bundle.image_size, bundle.preprocess);
    batch.resize(batch.size() * bundle.batch, 0.0f);  // extra stream slots idle
    for (int64_t served = 0; served < serves && !enough; ++served) {
      alerting.step_at(batch, live ? stamp : alerting.stepped * period, t0);
      enough = max_frames > 0 && alerting.stepped >= max_frames;
    }
    saver.after_frame(alerting);
    manager.alive();
    if (std::chrono::steady_clock::now() - reported >= kStatusEvery) {
      reported = std::chrono::steady_clock::now();
      manager.status(status_line(alerting, std::chrono::duration<double>(reported - started).count(),
                                 reader ? reader->frames().dropped() : 0));
    }
  }
  const int64_t index = alerting.stepped;
  const int64_t dropped = reader ? reader->frames().dropped() : 0;
  const bool lost = reader && reader->frames().lost() && !stop.requested();
  manager.stopping("stopping after " + std::to_string(index) + " frames");
  saver.save(alerting.last_time);  // the frame in hand finished: what the next start goes on from
  reader.reset();  // the reader thread ends (or, inside a stalled read, is left to end with the process)
  return report_end(stop, stream_name, index, dropped, lost);
}
#endif

int run(int argc, char** argv) {
  std::string bundle_path;
  const auto o = parse(argc, argv, bundle_path);
  const sdqes::Bundle bundle = sdqes::load_bundle(bundle_path);
  const sdqes::QueryTable queries = sdqes::load_queries(bundle);
  // Each query's policy as `sdqes-edge run` decides it: its own threshold, else --threshold, else the bundle's for
  // its label, else the default; the recorded hysteresis and cooldown unless the options say otherwise.
  sdqes::PolicyOptions options;
  if (o.count("--threshold")) options.threshold = real_number(o, "--threshold", 0);
  if (o.count("--exit-threshold")) options.exit_threshold = real_number(o, "--exit-threshold", 0);
  if (o.count("--cooldown")) options.cooldown_s = real_number(o, "--cooldown", 0);
  if (o.count("--max-alerts")) {
    options.max_alerts = static_cast<int>(std::min<int64_t>(whole_number("--max-alerts", o.at("--max-alerts"), 1),
                                                            std::numeric_limits<int>::max()));
  }
  std::vector<sdqes::AlertState> states;  // each policy checked here, before any engine is loaded
  for (size_t q = 0; q < queries.texts.size(); ++q) {
    states.emplace_back(sdqes::query_policy(bundle, queries.labels[q], queries.thresholds[q], options));
  }
  // -1: to the end of the source
  const int64_t max_frames = o.count("--max-frames") ? whole_number("--max-frames", o.at("--max-frames"), 1) : -1;
  const Source source = read_source(o.at("--source"));
  std::optional<sdqes::AlertStateFile> state_file;  // its folder checked before any engine is looked for
  if (o.count("--state")) state_file.emplace(o.at("--state"));
  const std::string backend = o.count("--backend") ? o.at("--backend") : sdqes::default_backend();
  sdqes::check_backend(backend, "--backend");
  const std::string precision = o.count("--precision") ? o.at("--precision") : sdqes::default_precision(backend);
  if (precision != "fp16" && precision != "fp32" && precision != "int8") {  // not "build a fp64 engine"
    throw sdqes::Error("--precision " + precision + " is not one of fp16, fp32, int8");
  }
  // 0: ONNX Runtime's default, a thread per core
  const int threads = o.count("--threads") ? static_cast<int>(std::min<int64_t>(
                                                 whole_number("--threads", o.at("--threads"), 1), 1024))
                                           : 0;
  if (threads > 0 && backend == "tensorrt") {
    std::cerr << "sdqes-run: warning: --threads is for the ONNX Runtime backend; TensorRT steps on the GPU, so it "
                 "is left out" << std::endl;
  }
  const sdqes::OpenedStep engine = sdqes::open_step(bundle, queries, backend, precision, threads);
#ifdef SDQES_CAN_STREAM
  return stream(bundle, queries, states, source, engine, max_frames, o.count("--events") ? o.at("--events") : "",
                state_file ? &*state_file : nullptr);
#else
  (void)max_frames;
  return 2;  // not reached: open_step refused, there being no backend
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const SourceUnavailable& e) {
    std::cerr << "sdqes-run: error: " << e.what() << std::endl;
    return 1;
  } catch (const sdqes::Error& e) {
    std::cerr << "sdqes-run: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "sdqes-run: error: " << e.what() << std::endl;
    return 2;
  }
}
