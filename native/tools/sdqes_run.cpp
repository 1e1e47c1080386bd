// sdqes-run: `sdqes-edge run` for C++ robots, on a bundle's TensorRT engine, or its ONNX graph on the CPU.
//   sdqes-run BUNDLE --source VIDEO|CAMERA|URL [--source ...] [--backend tensorrt|onnxruntime] [--precision fp16]
//             [--threshold X] [--exit-threshold X] [--cooldown S] [--max-alerts K] [--events FILE] [--state FILE]
//             [--max-frames N]
// Queries come pre-encoded in the bundle (sdqes-edge export --query ...). A user's mistake is one line on
// stderr and exit code 2; a camera or stream that cannot be opened, or that stopped sending frames and did not
// come back, exit code 1 (the machine's state: a service manager starts the run again), as `sdqes-edge run`.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <memory>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <opencv2/core/utils/logger.hpp>
#include <opencv2/videoio.hpp>
#include <opencv2/videoio/registry.hpp>
#include <unistd.h>

#include "sdqes/alert_state_file.hpp"
#include "sdqes/background_saves.hpp"
#include "sdqes/file_reader.hpp"
#include "sdqes/live_reader.hpp"
#include "sdqes/memory_file.hpp"
#include "sdqes/run_stats.hpp"
#include "sdqes/runtime.hpp"
#include "sdqes/saved_files.hpp"
#include "sdqes/service_manager.hpp"
#include "sdqes/step_backend.hpp"
#include "sdqes/step_gathering.hpp"
#if defined(SDQES_WITH_TENSORRT) || defined(SDQES_WITH_ONNXRUNTIME)
#define SDQES_CAN_STREAM 1  // a backend to step the graph on: the streaming loop is built
#endif

namespace {

const char* kUsage =
    "usage: sdqes-run BUNDLE --source VIDEO|CAMERA|URL [--source ...] [--backend tensorrt|onnxruntime]\n"
    "                 [--precision fp16|fp32|int8] [--threshold X] [--exit-threshold X] [--cooldown S]\n"
    "                 [--max-alerts K] [--events FILE] [--state FILE] [--max-frames N] [--threads N]\n"
    "                 [--stream-timeout S]\n"
    "       sdqes-run --version\n"
    "--backend: tensorrt steps the bundle's engine for this GPU (sdqes-edge build-engine); onnxruntime steps its\n"
    "ONNX graph on the CPU. The default is the first this sdqes-run was built with. --precision: fp16 on TensorRT,\n"
    "fp32 on ONNX Runtime unless given. --threads: ONNX Runtime's threads (default: one per core).\n"
    "--source again: several streams stepped together in one graph, a frame of each per step (a bundle exported\n"
    "with --batch N for N sources); a source that ends idles, its stream's memory kept, until every one has ended,\n"
    "and so does a camera whose frame has not come one sample period after a step's first, no step waiting for it\n"
    "until it sends again (a stalled camera does not hold the others' alerts). Of several cameras, one that cannot\n"
    "be opened at the start is named and the others start without it, and one lost is tried again every 8 s while\n"
    "another sends, rather than given up; one not sending at the end is named, with exit status 1; every one lost,\n"
    "they give up together and the run ends (exit status 1).\n"
    "--state FILE keeps each query's alert state across a restart (--max-alerts, hysteresis, cooldown), and the\n"
    "model's memory beside it (state.json -> state.memory): read at the start where they exist, written after an\n"
    "alert (at most every 5 s) and when the stream ends or is stopped; with several sources, files beside it for\n"
    "each (state.json -> state.kitchen.json, state.kitchen.memory). A video file goes on where the stopped run\n"
    "left it; a camera, or another file, starts at its beginning.\n"
    "--stream-timeout S: how long a stream URL may take to open, or to send its next frame, before it is\n"
    "reconnected (default 10; FFmpeg's own is 30).\n";

std::map<std::string, std::string> parse(int argc, char** argv, std::string& bundle,
                                         std::vector<std::string>& sources) {
  std::map<std::string, std::string> options;
  const std::map<std::string, bool> known{{"--source", true}, {"--precision", true}, {"--threshold", true},
                                          {"--exit-threshold", true}, {"--cooldown", true}, {"--max-alerts", true},
                                          {"--events", true}, {"--state", true}, {"--max-frames", true},
                                          {"--backend", true}, {"--threads", true}, {"--stream-timeout", true}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg == "--version") {  // sdqes-edge's release, and what this build can step a bundle on
      std::cout << "sdqes-run " << SDQES_VERSION << " (backends: " << sdqes::built_backends() << ")\n";
      std::exit(0);
    }
    if (arg.rfind("--", 0) == 0) {
      if (!known.count(arg)) throw sdqes::Error("unknown option " + arg + " (see sdqes-run --help)");
      if (i + 1 >= argc) throw sdqes::Error(arg + " needs a value");
      options[arg] = argv[++i];
      if (arg == "--source") sources.push_back(options[arg]);  // repeated for several streams
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
  std::string absent;  // a camera of several not plugged in: why it cannot be opened (open_all says it)
  double timeout_s = sdqes::kStreamTimeoutS;  // a stream URL's open and read timeout (--stream-timeout)

  bool open(cv::VideoCapture& capture) const {
    capture.release();
    if (kind == "camera") return capture.open(camera_index);
    if (sdqes::is_stream_url(spec)) return open_stream(capture);
    std::error_code error;
    if (std::filesystem::is_regular_file(spec, error)) return open_file(capture);  // not a camera's device file
    return capture.open(spec);
  }

  // A video file opened by the readers OpenCV would try, in its order, but its own MJPEG AVI reader where it has
  // FFmpeg, which reads every file that one does, as runtime/live_source.py's open_video_file: for a file FFmpeg
  // cannot open (cut off, damaged) that reader printed "Unexpected element. Expected: LIST. Got: ..." straight to
  // stderr, bytes of the file among the words, above the one-line error.
  bool open_file(cv::VideoCapture& capture) const {
    if (!cv::videoio_registry::hasBackend(cv::CAP_FFMPEG)) return capture.open(spec);
    if (capture.open(spec, cv::CAP_FFMPEG)) return true;
    for (const auto backend : cv::videoio_registry::getStreamBackends()) {
      if (backend != cv::CAP_FFMPEG && backend != cv::CAP_OPENCV_MJPEG && capture.open(spec, backend)) return true;
    }
    return false;
  }

  // A stream URL through FFmpeg with open and read timeouts of timeout_s (FFmpeg's own: 30 s), as
  // runtime/live_source.py's open_capture; given to FFmpeg alone, since a backend that does not know them refuses to
  // open. An OpenCV older than 4.5.4 (which added them), or without FFmpeg, opens it as it would.
  bool open_stream(cv::VideoCapture& capture) const {
#if CV_VERSION_MAJOR > 4 || (CV_VERSION_MAJOR == 4 && (CV_VERSION_MINOR > 5 || (CV_VERSION_MINOR == 5 && \
                                                                                  CV_VERSION_REVISION >= 4)))
    if (cv::videoio_registry::hasBackend(cv::CAP_FFMPEG)) {
      const int milliseconds = static_cast<int>(timeout_s * 1000);
      return capture.open(spec, cv::CAP_FFMPEG,
                          {cv::CAP_PROP_OPEN_TIMEOUT_MSEC, milliseconds, cv::CAP_PROP_READ_TIMEOUT_MSEC, milliseconds});
    }
#endif
    return capture.open(spec);
  }

  // An HTTP(S) URL whose container counts its frames: a video file, not a live stream (an IP camera's MJPEG counts
  // none), as runtime/live_source.py's serves_a_file tells them.
  bool serves_a_file(const cv::VideoCapture& capture) const {
    return kind == "web" && capture.get(cv::CAP_PROP_FRAME_COUNT) > 0;
  }
};

Source read_source(const std::string& spec, bool several, double timeout_s) {
  Source source{spec, sdqes::source_kind(spec), sdqes::without_password(spec), -1, "", timeout_s};
  if (source.kind == "camera") {
    source.camera_index = static_cast<int>(std::min<int64_t>(whole_number("--source", spec, 0),
                                                             std::numeric_limits<int>::max()));
  }
  if (source.kind == "missing" || source.kind == "file") {  // a video root keeps, given to a service's user: it was
    const std::string unreadable = sdqes::unreadable_problem(spec, R_OK);  // "neither a video file, ..."
    if (!unreadable.empty()) {
      throw sdqes::Error("--source " + spec + " " + unreadable + "; give a video this user may read");
    }
  }
  if (source.kind == "missing") {
    throw sdqes::Error("--source " + source.shown + " is neither a video file, a camera index nor a stream URL");
  } else if (source.kind == "missing camera") {
    source.absent = "no camera at " + spec + "; check it is connected (ls /dev/video*)";
    if (!several) throw SourceUnavailable(source.absent);  // before any engine is looked for
  } else if (source.kind == "folder") {
    throw sdqes::Error("--source " + spec + " is a folder; sdqes-run reads a video, a camera or a stream "
                       "(sdqes-edge run streams a folder of images)");
  }
  return source;
}

// One line on stderr, written whole under one lock: the reader threads say theirs (a lost camera, a reconnection)
// while the main thread says its own, and a line written in pieces was cut by another's ("sdqes-run: sdqes-run:
// camera: no frame ..." on one line, the main thread's words without their prefix on the next). Its control
// characters shown, not obeyed: a line may quote a path, a source's name or a bundle's words.
void write_line(const std::string& line) {
  static std::mutex writing;
  const std::string whole = sdqes::terminal_safe(line) + "\n";
  const std::lock_guard<std::mutex> lock(writing);
  std::cerr << whole << std::flush;
}

void say(const std::string& line) { write_line("sdqes-run: " + line); }

#ifdef SDQES_CAN_STREAM
// A video file's VideoCapture as its reader thread reads it (sdqes::FileReader: a frame decoded and preprocessed
// while the engine steps the one before).
std::shared_ptr<sdqes::FileCapture> file_capture(const std::shared_ptr<cv::VideoCapture>& video,
                                                 sdqes::PrepareFrame prepare) {
  auto capture = std::make_shared<sdqes::FileCapture>();
  capture->grab = [video] { return video->grab(); };
  capture->stamp_s = [video] { return video->get(cv::CAP_PROP_POS_MSEC) / 1000.0; };
  capture->retrieve = [video](cv::Mat& image) { return video->retrieve(image); };
  capture->end_time_s = sdqes::stated_end_time(video->get(cv::CAP_PROP_FRAME_COUNT), video->get(cv::CAP_PROP_FPS));
  capture->prepare = std::move(prepare);
  return capture;
}

// A live source's VideoCapture as the reader thread reads it: every frame grabbed, only a sampled one decoded.
std::shared_ptr<sdqes::LiveCapture> live_capture(const std::shared_ptr<cv::VideoCapture>& video, const Source& source,
                                                 sdqes::PrepareFrame prepare) {
  auto capture = std::make_shared<sdqes::LiveCapture>();
  capture->grab = [video] { return video->grab(); };
  capture->retrieve = [video](cv::Mat& image) { return video->retrieve(image); };
  // A URL taken for a camera where it could not be opened at the start (a camera of several), which now serves a
  // video file, is refused: read live, its frames would be stamped by the clock, most dropped, the file replayed
  // forever. Thrown on the reader's thread, the loop raises it: the run ends, exit 1, for a restart to read it as
  // the file it is.
  capture->reopen = [video, source] {
    if (!source.open(*video)) return false;
    if (!source.serves_a_file(*video)) return true;
    video->release();
    throw SourceUnavailable(source.shown + " serves a video file, not a live stream, and a live source would stamp "
                            "its frames by the clock, drop most of them and replay it forever: it could not be opened "
                            "when the run started, so it was taken for a camera; start the run again to read it as "
                            "the file it is");
  };
  capture->prepare = std::move(prepare);
  return capture;
}


// One stream's alerts: each query's alert state; an alert raised is written to the JSONL sink (when there is one),
// then printed.
struct StreamAlerts {
  const sdqes::QueryTable& queries;
  std::vector<sdqes::AlertState> states;
  sdqes::JsonlSink* sink;
  std::string stream_name;
  bool named_when_printed;  // several streams: each printed alert says whose it is
  std::ostream* printed = &std::cout;  // std::cerr where --events is stdout: the JSONL alone there (its reader's)
  int64_t stepped = 0;      // frames of this stream stepped so far: the next one's index
  int64_t raised = 0;       // alerts raised so far
  double last_time = 0.0;   // the last step's stream time

  // The queries' probabilities on this stream's frame at stream time `time`, `latency` ms after it was in hand.
  void update(const std::vector<float>& probs, double time, double latency) {
    last_time = time;
    std::vector<sdqes::AlertEvent> raised_now;
    for (size_t q = 0; q < probs.size(); ++q) {
      if (!std::isfinite(probs[q])) throw sdqes::Error("the model produced a non-finite score; stopping the stream");
      if (!states[q].update(probs[q], time)) continue;
      raised_now.push_back({"q" + std::to_string(q + 1), queries.texts[q], queries.messages[q], stream_name, time,
                            stepped, probs[q], std::log(probs[q] / (1 - probs[q])), latency,
                            states[q].policy().threshold,
                            queries.labels[q].empty() ? std::nullopt : std::optional<std::string>(queries.labels[q])});
    }
    // Logged first, in one write and one sync: a closed stdout (`| head`) ends the process by SIGPIPE at the print.
    if (sink) sink->write(raised_now);
    for (const auto& e : raised_now) {
      std::ostringstream line;  // the message is the bundle's: its control characters shown, not obeyed
      line << "[" << (named_when_printed ? stream_name + " " : "") << time << " s] " << e.message;
      *printed << sdqes::terminal_safe(line.str()) << "  (p=" << e.score << ")" << std::endl;
      if (!*printed) {  // stdout in a file on a full disk (a unit's StandardOutput=file:): said, not lost silently
        const int failure = errno;
        printed->clear();
        throw sdqes::OutputRefused(std::string("cannot print an alert on ") +
                                   (printed == &std::cerr ? "stderr (" : "stdout (") + std::strerror(failure) +
                                   "): the file or disk it goes to refuses it; free some space there or send "
                                   "stdout elsewhere, and run again");
      }
      ++raised;
    }
    ++stepped;
  }
};

// --state: a stream's alert states, and the model's memory of it, written after an alert (at most every
// kAlertStateEveryS, so that a power cut or a kill keeps each alert's count and time) and when the stream ends or is
// stopped. Both are taken at once and written by the run's writing thread (sdqes::BackgroundSaves), so that the
// stream does not wait on the disk.
struct StateSaver {
  std::optional<sdqes::AlertStateFile> file;
  std::filesystem::path memory;  // beside the file (memory_path_of)
  std::string source;            // the source's identity (OpenSource): where it got to is kept with the alert states
  const sdqes::OpenedStep* engine = nullptr;
  sdqes::BackgroundSaves* saves = nullptr;  // the run's writing thread
  int stream = 0;  // the stream of the graph whose memory it keeps
  int64_t saved_raised = 0;  // alerts raised when it was last handed over
  // The writing thread's word that the last write failed: both files are handed over again.
  std::shared_ptr<std::atomic<bool>> failed = std::make_shared<std::atomic<bool>>(false);
  std::chrono::steady_clock::time_point saved_at = std::chrono::steady_clock::time_point::min();

  void after_frame(const StreamAlerts& alerts) {
    if (!file || (alerts.raised == saved_raised && !failed->load())) return;
    const auto now = std::chrono::steady_clock::now();
    if (saved_at != std::chrono::steady_clock::time_point::min() &&
        std::chrono::duration<double>(now - saved_at).count() < sdqes::kAlertStateEveryS) {
      return;  // written at the next frame past the interval
    }
    save(alerts);
    saved_raised = alerts.raised;
    saved_at = now;
  }

  // Hands both files over to be written. A failure is said by the writing thread and the stream goes on (its alerts
  // matter more than the files), tried again at each frame past the interval: said once, however often it fails
  // again, and said again once written, as `sdqes-edge run --state` says them.
  void save(const StreamAlerts& alerts) const {
    if (!file) return;
    std::optional<sdqes::MemoryContents> memory_contents;  // a copy of the stream's state, as it is now
    try {
      memory_contents = sdqes::memory_contents(*engine, stream);
    } catch (const sdqes::Error& e) {
      say(std::string("warning: cannot write ") + memory.string() + ": " + e.what());
    }
    auto write = [memory = memory, memory_contents = std::move(memory_contents), file = *file,
                  states = sdqes::AlertStateFile::contents(alerts.queries, alerts.states, alerts.last_time,
                                                           {source, alerts.stepped}),
                  failed = failed] {
      std::vector<std::string> refusals;  // each file's, in the words of its error
      if (memory_contents) {
        try {
          sdqes::write_memory(memory, *memory_contents);
        } catch (const sdqes::Error& e) {
          refusals.emplace_back(e.what());
        }
      }
      try {
        file.write(states);
      } catch (const sdqes::Error& e) {
        refusals.emplace_back(e.what());
      }
      const bool failed_before = failed->exchange(!refusals.empty());
      if (!failed_before) {
        std::ostringstream again;
        again << "; the stream goes on, and tries again every " << sdqes::kAlertStateEveryS << " s";
        for (const auto& refusal : refusals) say("warning: " + refusal + again.str());
      } else if (refusals.empty()) {
        say("note: --state " + file.path().string() + " is written again");
      }
    };
    saves->save(file->path().string(), std::move(write));
  }

  // The model's memory of the stream from the last run, where it left one; one that cannot be used (another model's,
  // damaged) is set aside with a warning, and the stream starts fresh.
  void restore_memory(sdqes::OpenedStep& step) const {
    if (!std::filesystem::exists(memory)) {
      if (std::filesystem::exists(file->path())) {  // a --state of an sdqes-run before memory was kept
        say("note: no model memory at " + memory.string() + " yet: the model starts fresh, its memory written there "
            "with the alert states");
      }
      return;
    }
    try {
      const std::string kept_by = sdqes::load_memory(memory, step, stream);
      say("resumed the model's memory from " + memory.string() +
          (kept_by.empty() ? "" : " (kept by the " + kept_by + " step graph, converted)"));
    } catch (const sdqes::UnusableMemory& e) {
      sdqes::set_aside_unusable(memory, "--state memory", e.problem, "the model starts fresh", say);
    }
  }
};

// How often `systemctl status` hears how the run is doing: one datagram, so as often as a terminal's status line.
constexpr std::chrono::seconds kStatusEvery{5};

// The source opened, whether it is read live, what alerts call it (the JSONL `stream`, as `sdqes-edge run` calls it;
// a URL's password never shown), and what --state knows a file by (sdqes::SourcePlace; empty for a live source).
struct OpenSource {
  std::shared_ptr<cv::VideoCapture> video;
  bool live;
  std::string name;
  std::string identity;
  bool keep_trying = false;  // lost: tried again every last back-off delay, never given up (a camera of several)
};

// A file by its absolute path and size, as runtime/sources.py's identity: the same file, not rewritten since. A video
// over HTTP has no size to read without fetching it again; its length stands in. A live source has none.
std::string identity_of(const Source& source, bool live, const cv::VideoCapture& video) {
  if (live) return "";
  if (source.kind != "file") {
    return source.shown + " (" + std::to_string(static_cast<int64_t>(video.get(cv::CAP_PROP_FRAME_COUNT))) +
           " frames)";
  }
  std::error_code error;
  const auto path = std::filesystem::canonical(source.spec, error);
  const auto bytes = std::filesystem::file_size(source.spec, error);
  return error ? "" : path.string() + " (" + std::to_string(bytes) + " bytes)";
}

// Said of a source still opening after sdqes::kStallNoticeS (runtime/source_opening.py's words).
void say_still_opening(const Source& source) {
  std::ostringstream words;
  words << "still opening " << source.shown << " after " << sdqes::kStallNoticeS
        << " s: OpenCV waits up to " << source.timeout_s
        << " s for a stream that answers but sends nothing; Ctrl-C stops the run";
  say(words.str());
}

// A live source's name in alerts and output files, as `sdqes-edge run` names it.
std::string live_name(const Source& source) {
  return source.kind == "camera" ? sdqes::camera_name(source.camera_index) : sdqes::live_source_name(source.spec);
}

OpenSource open_source(const Source& source) {
  if (!source.absent.empty()) throw SourceUnavailable(source.absent);
  auto video = std::make_shared<cv::VideoCapture>();
  bool opened = false;
  {
    const sdqes::NoticeIfSlow notice(sdqes::kStallNoticeS, [&source] { say_still_opening(source); });
    opened = source.open(*video);  // no stop handler yet: a signal here ends the process at once, nothing written
  }
  if (!opened) {
    if (source.kind == "file") throw sdqes::Error("OpenCV cannot open " + source.shown + "; check the file plays");
    throw SourceUnavailable("OpenCV cannot open " + source.shown + "; check the camera is connected, or that the "
                            "URL plays from this machine");
  }
  const bool live = sdqes::is_live_kind(source.kind) || (source.kind == "web" && !source.serves_a_file(*video));
  const std::string name = live ? live_name(source) : sdqes::video_file_name(source.spec);
  return {video, live, name, identity_of(source, live, *video)};
}

// Each source opened, in order. Several cameras (every source live) are a run that goes on while any of them sends,
// as `sdqes-edge run`'s (runtime/source_opening.py): one that cannot be opened at the start is said, and starts
// unopened (its reader begins by reconnecting) where another opened; each keeps trying when lost. Otherwise the first
// source that cannot be opened is thrown, as before.
std::vector<OpenSource> open_all(const std::vector<Source>& sources) {
  std::vector<OpenSource> opens;
  std::vector<std::string> absent(sources.size());  // why each camera not there now cannot be opened
  for (size_t s = 0; s < sources.size(); ++s) {
    try {
      opens.push_back(open_source(sources[s]));
    } catch (const SourceUnavailable& e) {
      if (sources.size() == 1) throw;
      absent[s] = e.what();
      opens.push_back({std::make_shared<cv::VideoCapture>(), true, live_name(sources[s]), ""});
    }
  }
  const bool cameras = std::all_of(opens.begin(), opens.end(), [](const OpenSource& o) { return o.live; });
  const bool one_opened = std::any_of(absent.begin(), absent.end(), [](const std::string& a) { return a.empty(); });
  for (size_t s = 0; s < sources.size(); ++s) {
    if (absent[s].empty()) continue;
    if (!cameras || !one_opened) throw SourceUnavailable(absent[s]);  // a run with files, or no camera there
    say("warning: " + absent[s] + ". The other cameras start without it; it is tried again as a lost camera is, "
        "its stream idling meanwhile");
  }
  for (auto& open : opens) open.keep_trying = sources.size() > 1 && cameras;
  return opens;
}

// The file --state keeps a stream's alert states in: the path given for one source; for several, one beside it
// named for each stream (state.json -> state.kitchen.json), as `sdqes-edge run` names its per-source outputs.
std::filesystem::path state_path_of(const std::filesystem::path& given, const std::string& name, size_t sources) {
  if (sources == 1) return given;
  return given.parent_path() / (given.stem().string() + "." + name + given.extension().string());
}

// The model's memory of a stream, beside its alert state file: state.json -> state.memory (state.memory ->
// state.memory.memory, never the file itself).
std::filesystem::path memory_path_of(std::filesystem::path state_file) {
  const auto given = state_file;
  if (state_file.replace_extension(".memory") == given) return given.string() + ".memory";
  return state_file;
}

// One --source as the loop steps it: its frames, read and preprocessed on a thread of its own (a file's by
// sdqes::FileReader, each sample time stepped; a live source's by sdqes::LiveReader, stamped by the wall clock, each
// frame stepped once, the ones the loop had no time for dropped), its stream's alerts and its --state file.
struct StreamSource : sdqes::GatheredSource {
  StreamSource(OpenSource source, StreamAlerts stream_alerts)
      : opened(std::move(source)), alerts(std::move(stream_alerts)) {}

  OpenSource opened;
  StreamAlerts alerts;
  StateSaver saver;
  std::unique_ptr<sdqes::FrameReader> reader;
  std::vector<float> frame;  // the frame in hand, preprocessed
  std::chrono::steady_clock::time_point in_hand;
  double stamp = 0.0;   // a live frame's wall-clock time
  int64_t repeats = 0;  // sample times a file's frame in hand still serves (a video slower than the bundle)
  int64_t resumed_at = 0;  // the sample a file goes on at, where --state had it (0: its beginning)
  bool has_ended = false;

  const std::string& name() const override { return opened.name; }
  bool live() const override { return opened.live; }
  bool ended() const override { return has_ended; }
  bool ready() const override { return has_ended || repeats > 0 || reader->frames().ready(); }

  // The next sample time's frame, preprocessed into `frame`; false once the source has ended or the run is stopped.
  bool next(const std::function<bool()>& stopped) override {
    if (has_ended) return false;
    if (repeats > 0) {  // a repeated frame: in hand as the sample time comes
      --repeats;
      in_hand = std::chrono::steady_clock::now();
      return true;
    }
    sdqes::LatestFrame::Frame taken;  // a live frame serves once: repeating a stale one puts the model behind the world
    has_ended = !reader->frames().take(taken, stopped);
    if (has_ended) return false;
    in_hand = std::chrono::steady_clock::now();
    frame = std::move(taken.prepared);  // preprocessed on the reader's thread (stream's `prepare`)
    stamp = taken.stamp;
    repeats = taken.serves - 1;
    return true;
  }

  // This stream's time at its next step: a live frame's stamp, a file's sample time.
  double time(double period) const { return opened.live ? stamp : alerts.stepped * period; }
  // Lost for good; or, where it kept trying (a camera of several), not sending when the run ended.
  bool lost() const { return reader ? lost_now() : was_lost; }
  sdqes::LatestFrame::Reconnection reconnection() const {
    return reader ? reader->frames().reconnection() : last_reconnection;
  }
  int64_t dropped() const { return reader ? reader->frames().dropped() : dropped_frames; }
  // The reader thread ended (or, inside a stalled read, left to end with the process), what it counted kept.
  void finish() {
    if (!reader) return;
    was_lost = lost_now();
    last_reconnection = reader->frames().reconnection();
    dropped_frames = reader->frames().dropped();
    reader.reset();
  }

 private:
  bool was_lost = false;
  sdqes::LatestFrame::Reconnection last_reconnection;
  bool lost_now() const {
    return reader->frames().lost() || (opened.keep_trying && reader->frames().reconnection().under_way);
  }
  int64_t dropped_frames = 0;
};

// Each source opened, named apart from the others, and given its stream's alert states (restored from --state).
std::vector<std::unique_ptr<StreamSource>> open_sources(const sdqes::Bundle& bundle, const sdqes::QueryTable& queries,
                                                        const std::vector<sdqes::AlertState>& policies,
                                                        const std::vector<Source>& sources,
                                                        const std::optional<std::filesystem::path>& state_path,
                                                        sdqes::OpenedStep& engine, sdqes::BackgroundSaves& saves) {
  std::vector<OpenSource> opens = open_all(sources);
  std::vector<std::string> names;
  for (const auto& open : opens) names.push_back(open.name);
  if (!sdqes::give_distinct_names(names).empty()) {  // alerts and --state files are named after their source
    std::string called;
    for (size_t s = 0; s < names.size(); ++s) called += (s ? ", " : "") + names[s];
    say("note: several sources have the same name; in alerts and outputs they are called " + called);
  }
  std::vector<std::unique_ptr<StreamSource>> opened;
  for (size_t s = 0; s < sources.size(); ++s) {
    const Source& source = sources[s];
    const std::string& name = names[s];
    opens[s].name = name;
    const bool several = sources.size() > 1;
    opened.push_back(std::make_unique<StreamSource>(std::move(opens[s]),
                                                    StreamAlerts{queries, policies, nullptr, name, several}));
    auto& stream = *opened.back();
    if (state_path) {
      stream.saver.file.emplace(state_path_of(*state_path, name, sources.size()));
      stream.saver.source = stream.opened.identity;
      const auto resumed = stream.saver.file->restore(queries, stream.alerts.states, stream.opened.identity, say);
      if (resumed.position > 0) {  // the file it was reading: on from where it stopped, stream times continuing
        stream.resumed_at = stream.alerts.stepped = resumed.position;
        stream.alerts.last_time = resumed.stream_time;
        std::ostringstream at;
        at << resumed.position / bundle.fps;
        say("note: " + name + " goes on at " + at.str() + " s, where the run that saved " +
            stream.saver.file->path().string() + " stopped");
      }
      stream.saver.memory = memory_path_of(stream.saver.file->path());
      stream.saver.engine = &engine;
      stream.saver.saves = &saves;
      stream.saver.stream = static_cast<int>(s);
      stream.saver.restore_memory(engine);
    }
    const double native_fps = stream.opened.live ? 0.0 : stream.opened.video->get(cv::CAP_PROP_FPS);
    if (native_fps > 0 && native_fps < bundle.fps) {
      std::ostringstream note;
      note << "note: " << source.shown << " has " << native_fps << " frames per second, fewer than the "
           << bundle.fps << " the bundle samples: each frame is repeated for the sample times it covers";
      say(note.str());
    }
  }
  return opened;
}

// Every source's frames dropped and alerts raised so far.
std::pair<int64_t, int64_t> dropped_and_raised(const std::vector<std::unique_ptr<StreamSource>>& streams) {
  int64_t dropped = 0, raised = 0;
  for (const auto& s : streams) {
    dropped += s->dropped();
    raised += s->alerts.raised;
  }
  return {dropped, raised};
}

// "29.8 frames/s, latency p50 21 ms, p99 35 ms, dropped 0, 1 alert": `systemctl status`'s line, as `sdqes-edge run`
// gives it.
std::string status_line(const std::vector<std::unique_ptr<StreamSource>>& streams, int64_t steps, double seconds,
                        const sdqes::LatencyHistogram& latencies) {
  const auto [dropped, raised] = dropped_and_raised(streams);
  return sdqes::status_words(seconds > 0 ? steps / seconds : 0.0, latencies, dropped, raised);
}

// What the run streamed: "20 steps of 2 sources, 0 alerts, 5.0 steps/s, latency p50 ...".
std::string counted_words(const std::vector<std::unique_ptr<StreamSource>>& streams, int64_t steps, double seconds,
                          const sdqes::LatencyHistogram& latencies) {
  const auto [dropped, raised] = dropped_and_raised(streams);
  // As `sdqes-edge run` counts them: with several sources a step takes a frame of each, so steps are counted.
  const std::string unit = streams.size() > 1 ? "step" : "frame";
  return std::to_string(steps) + " " + unit + (steps == 1 ? "" : "s") +
         (streams.size() > 1 ? " of " + std::to_string(streams.size()) + " sources" : "") +
         sdqes::run_words(steps, raised, seconds, latencies, unit) +
         (dropped ? ", " + std::to_string(dropped) + " frames dropped (the engine is slower than the source)" : "");
}

// The run's last lines on stderr (its summary, then what went wrong, as `sdqes-edge run` ends), and its exit status:
// 128 + a signal; 1 where a live source was lost (a failure, so a service manager starts the run again); else 0.
int report_end(const sdqes::StopOnSignal& stop, const std::vector<std::unique_ptr<StreamSource>>& streams,
               int64_t steps, double seconds, const sdqes::LatencyHistogram& latencies, double period_s) {
  const std::string counted = counted_words(streams, steps, seconds, latencies);
  if (stop.requested()) {
    say("interrupted (" + std::string(stop.signal_name()) + ") after " + counted);
    return stop.exit_code();
  }
  write_line("done: " + counted);
  bool lost = false;
  for (const auto& s : streams) {
    if (!s->lost()) continue;  // a live source never ends: it went away
    lost = true;
    if (s->opened.keep_trying) {  // runtime/frame_source.py's lost_words, kept_trying
      say("error: " + s->opened.name + " was not sending frames when the run ended (" +
          (s->reconnection().back_off_spent
               ? "lost after " + std::to_string(sdqes::reconnect_delays_s().size()) +
                     " reconnection attempts in vain, then tried again every few seconds"
               : std::string("it was being reconnected")) +
          ") (exit status 1)");
      continue;
    }
    say("error: " + s->opened.name + " stopped sending frames and did not come back after " +
        std::to_string(sdqes::reconnect_delays_s().size()) + " reconnection attempts: the stream ended there after " +
        std::to_string(s->alerts.stepped) + " frames, every output complete (exit status 1)");
  }
  for (const auto& s : streams) {  // resumed past its end: 0 frames, which is right, and said why
    if (s->resumed_at == 0 || s->alerts.stepped > s->resumed_at) continue;
    std::ostringstream note;
    note << "note: " << s->opened.name << " has no frames after " << s->resumed_at * period_s
         << " s, where --state had it: the run it resumes had streamed it to its end";
    say(note.str());
  }
  return lost ? 1 : 0;
}

// --state's files still refused when the stream ended (each refusal said as it came): the run's error, exit status 1
// whatever ended it (a signal's stop too: what the next start goes on from is not there), as `sdqes-edge run --state`
// ends then.
int said_unsaved(const std::vector<std::unique_ptr<StreamSource>>& streams, int status) {
  for (const auto& s : streams) {
    if (!s->saver.file || !s->saver.failed->load()) continue;
    say("error: --state " + s->saver.file->path().string() + " could not be written when the stream ended (said "
        "above), and holds what was written last, if anything; free some space or give --state another path, and "
        "run again");
    status = 1;
  }
  return status;
}

// Steps the engine on the sources' frames, a stream each, and raises each stream's alerts until every source ends,
// --max-frames, or a signal. Each step takes every source's next frame, as `sdqes-edge run` does (a live one's unless
// it falls behind: sdqes::gather_step); a source that has ended idles (its stream's state kept), and the extra
// streams of a bundle exported for more idle throughout.
int stream(const sdqes::Bundle& bundle, const sdqes::QueryTable& queries,
           const std::vector<sdqes::AlertState>& policies, const std::vector<Source>& sources,
           sdqes::OpenedStep& engine, int64_t max_frames, const std::string& events,
           const std::optional<std::filesystem::path>& state_path) {
  sdqes::BackgroundSaves saves(say);  // --state's files: before the streams, whose last states it writes
  auto streams = open_sources(bundle, queries, policies, sources, state_path, engine, saves);
  std::unique_ptr<sdqes::JsonlSink> sink;  // once every source is open: one that is not leaves no log behind
  if (!events.empty()) sink = std::make_unique<sdqes::JsonlSink>(events);
  // --events - (or /dev/stdout): stdout carries the alerts' JSONL alone, read by another program
  std::ostream* alert_lines = !events.empty() && sdqes::same_file(STDOUT_FILENO, events) ? &std::cerr : &std::cout;
  for (auto& stream : streams) {
    stream->alerts.sink = sink.get();
    stream->alerts.printed = alert_lines;
  }
  const double period = 1.0 / bundle.fps;
  const sdqes::StopOnSignal stop;  // Ctrl-C, docker stop, systemd: the frame in hand is finished, then the loop ends
  bool any_live = false;
  // Each frame preprocessed on its reader's thread, while the engine steps the one before (by value: a reader left
  // inside a stalled read outlives this function).
  const sdqes::PrepareFrame prepare = [size = bundle.image_size, how = bundle.preprocess](const cv::Mat& image) {
    return sdqes::preprocess(image, size, how);
  };
  const auto arrivals = std::make_shared<sdqes::Arrivals>();  // every live reader's frames: a step waits for whichever
  const auto cameras = std::make_shared<sdqes::Cameras>(streams.size());  // those that keep trying when lost
  std::vector<sdqes::GatheredSource*> gathered;
  for (size_t s = 0; s < sources.size(); ++s) {  // each reader's clock starts here, after the warm-up
    auto& stream = *streams[s];
    any_live = any_live || stream.opened.live;
    if (stream.opened.live) {
      stream.reader = std::make_unique<sdqes::LiveReader>(live_capture(stream.opened.video, sources[s], prepare),
                                                          stream.opened.name, period, say, sdqes::reconnect_delays_s(),
                                                          stream.opened.keep_trying ? cameras : nullptr, s);
    } else {
      stream.reader = std::make_unique<sdqes::FileReader>(file_capture(stream.opened.video, prepare), period,
                                                          stream.resumed_at);
    }
    if (stream.opened.live) stream.reader->frames().notify_also(arrivals);  // a file's frames are waited for in turn
    gathered.push_back(&stream);
  }
  sdqes::LateSources late(streams.size());  // the live sources a step stopped waiting for
  const auto stopped = [&stop] { return stop.requested(); };
  std::ostringstream header;  // as `sdqes-edge run` starts: what streams, how fast, what is asked, on what
  header << "streaming ";
  for (size_t s = 0; s < streams.size(); ++s) header << (s ? ", " : "") << streams[s]->opened.name;
  header << " at " << bundle.fps << " fps with " << queries.texts.size()
         << (queries.texts.size() == 1 ? " query" : " queries") << " (" << engine.words << ")";
  say(header.str() + (any_live ? "; Ctrl-C to stop" : ""));
  sdqes::ServiceManager manager;  // systemd's Type=notify: ready now, a watchdog ping per frame, stopping at the end
  manager.ready(header.str());
  // The demo's model deployed as it is: what it was trained on, as `sdqes-edge run` notes it.
  const std::string trained_on = sdqes::training_data_words(bundle);
  if (!trained_on.empty()) say("note: this model was trained on " + trained_on + " only; on other footage its alerts "
                               "mean little");
  const std::string random = sdqes::random_weights_words(bundle.manifest);
  if (!random.empty()) say("warning: " + sdqes::random_weights_warning(random));
  sdqes::StreamBatch batch(static_cast<int>(bundle.batch),
                          3 * static_cast<size_t>(bundle.image_size) * bundle.image_size);
  std::vector<const float*> frames(bundle.batch, nullptr);  // each source's frame; the extra streams' none
  const auto started = std::chrono::steady_clock::now();
  auto reported = started, printed = started;
  const double print_every = sdqes::live_report_seconds(::isatty(STDERR_FILENO) != 0);
  int64_t steps = 0;
  sdqes::LatencyHistogram latencies;  // every stream's, as `sdqes-edge run` reports them together
  const auto wind_up = [&] {  // every stream's --state written and its reader ended: what the next start goes on from
    manager.stopping("stopping after " + std::to_string(steps) + " frames");
    for (auto& stream : streams) {
      stream->saver.save(stream->alerts);
      stream->finish();
    }
    saves.wait();  // on the disk before the run says it is done
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  try {
    while (!stop.requested() && !(max_frames > 0 && steps >= max_frames)) {
      const auto taken =
          sdqes::gather_step(gathered, *arrivals, sdqes::kLivePatiencePeriods * period, late, stopped, say);
      for (size_t s = 0; s < streams.size(); ++s) frames[s] = taken[s] ? streams[s]->frame.data() : nullptr;
      if (stop.requested()) break;
      const auto* embedding = batch.step(*engine.backend, frames.data());
      if (embedding == nullptr) break;  // every source ended
      for (size_t s = 0; s < streams.size(); ++s) {
        auto& stream = *streams[s];
        if (batch.idle(static_cast<int>(s))) continue;
        const auto probs = sdqes::query_probabilities(*engine.backend, *embedding, queries, static_cast<int>(s));
        // latency: from the frame in hand to its scores
        const double latency_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stream.in_hand).count();
        latencies.add(latency_ms);
        stream.alerts.update(probs, stream.time(period), latency_ms);
        stream.saver.after_frame(stream.alerts);
      }
      ++steps;
      if (sink) sink->retry();  // alerts the disk refused, tried again between alerts
      manager.alive();
      if (std::chrono::steady_clock::now() - reported >= kStatusEvery) {
        reported = std::chrono::steady_clock::now();
        const std::string line =
            status_line(streams, steps, std::chrono::duration<double>(reported - started).count(), latencies);
        manager.status(line);
        if (any_live && std::chrono::duration<double>(reported - printed).count() >= print_every) {
          say(line);  // a live run has no end line to wait for: how it is doing, now and then
          printed = reported;
        }
      }
    }
  } catch (const sdqes::Error&) {  // a source's reader failed in the middle of the stream (a camera turned out a file)
    // What ran first, as a stop says it, then the error (main says it), as `sdqes-edge run` ends then.
    const double seconds = wind_up();
    if (steps > 0) say("interrupted after " + counted_words(streams, steps, seconds, latencies));  // else said alone
    try {
      if (sink) sink->finish();
    } catch (const sdqes::OutputRefused& refused) {  // said; the run's error is the reader's
      say(std::string("warning: ") + refused.what());
    }
    throw;
  }
  const double seconds = wind_up();
  const int status = said_unsaved(streams, report_end(stop, streams, steps, seconds, latencies, period));
  if (sink) sink->finish();  // alerts the disk still refuses: the run's error, after its summary (exit status 1)
  return status;
}
#endif

// OpenCV's and FFmpeg's own logs silenced, before any source is opened: sdqes-run says what went wrong with a source
// in one line, where OpenCV printed a dozen of its backends' errors for a URL it could not open (as
// runtime/sources.py's quiet_opencv_logs; FFmpeg reads its level when OpenCV first opens a file).
void quiet_opencv_logs() {
  ::setenv("OPENCV_FFMPEG_LOGLEVEL", "-8", 0);
  cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT);
}

// A text as Python's repr() quotes it ('...', or "..." for one holding ' and no "), its quote, backslashes and
// ASCII control characters escaped as repr escapes them: the query in a warning reads as `sdqes-edge run` gives it.
std::string python_quoted(const std::string& text) {
  const char quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string quoted(1, quote);
  for (const unsigned char c : text) {
    if (c == '\\' || c == quote) {
      quoted += '\\';
      quoted += static_cast<char>(c);
    } else if (c == '\n' || c == '\r' || c == '\t') {
      quoted += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      quoted += escaped;
    } else {
      quoted += static_cast<char>(c);
    }
  }
  return quoted + quote;
}

// Each query's threshold that no score reaches, or that lies below every score, said once for each value as
// `sdqes-edge run` says it (runtime/queries.py): a query's own in the bundle, its label's, the bundle's default or a
// --threshold below every score (one above them all is refused, by policy_options). Said, not refused: the bundle
// is someone's choice, and a threshold below every score alerts, once.
void say_thresholds_out_of_reach(const std::vector<sdqes::AlertState>& states, const sdqes::QueryTable& queries) {
  std::vector<double> said;
  for (size_t q = 0; q < states.size(); ++q) {
    const double threshold = states[q].policy().threshold;
    const std::string why = sdqes::out_of_reach_words(threshold, "the query");
    if (why.empty() || std::find(said.begin(), said.end(), threshold) != said.end()) continue;
    said.push_back(threshold);
    std::ostringstream words;  // the threshold as Python's :g writes it
    words << "warning: the threshold " << threshold << " of query q" << q + 1 << " (" << python_quoted(queries.texts[q])
          << ", and of any query given it after) " << why;
    say(words.str());
  }
}

// --threshold, --exit-threshold, --cooldown and --max-alerts, each refused naming its option in the words
// `sdqes-edge run` gives (the policy's own words name none). An --exit-threshold above a query's own threshold or
// the bundle's is refused as that query's policy is made.
sdqes::PolicyOptions policy_options(const std::map<std::string, std::string>& o) {
  sdqes::PolicyOptions options;
  if (o.count("--threshold")) {
    options.threshold = real_number(o, "--threshold", 0);
    if (!(*options.threshold > 0.0 && *options.threshold < 1.0)) {
      throw sdqes::Error("--threshold " + o.at("--threshold") + " is outside (0, 1): it is a probability sigmoid(cos)");
    }
    if (*options.threshold >= sdqes::kHighestScore) {  // below every score: said as each query's (below)
      throw sdqes::Error("--threshold " + o.at("--threshold") + " " +
                         sdqes::out_of_reach_words(*options.threshold, "any query at it"));
    }
  }
  if (o.count("--exit-threshold")) {
    const double exit_threshold = real_number(o, "--exit-threshold", 0);
    const std::string given = "--exit-threshold " + o.at("--exit-threshold");
    if (!(exit_threshold >= 0.0 && exit_threshold < 1.0)) {
      throw sdqes::Error(given + " is outside [0, 1): a query stays on until its p falls to it, a probability "
                         "sigmoid(cos)");
    }
    if (options.threshold && exit_threshold > *options.threshold) {
      throw sdqes::Error(given + " is above --threshold " + o.at("--threshold") + ": a query stays on until its p "
                         "falls to it, so give one at or below the threshold");
    }
    options.exit_threshold = exit_threshold;
  }
  if (o.count("--cooldown")) {
    options.cooldown_s = real_number(o, "--cooldown", 0);
    if (*options.cooldown_s < 0.0) throw sdqes::Error("--cooldown needs at least 0 s, not '" + o.at("--cooldown") + "'");
  }
  if (o.count("--max-alerts")) {
    options.max_alerts = static_cast<int>(std::min<int64_t>(whole_number("--max-alerts", o.at("--max-alerts"), 1),
                                                            std::numeric_limits<int>::max()));
  }
  return options;
}

int run(int argc, char** argv) {
  std::string bundle_path;
  std::vector<std::string> source_specs;
  auto o = parse(argc, argv, bundle_path, source_specs);
  if (o.count("--events") && o.at("--events") == "-") o["--events"] = "/dev/stdout";  // as `sdqes-edge run` takes it
  quiet_opencv_logs();
  const sdqes::Bundle bundle = sdqes::load_bundle(bundle_path);
  const sdqes::QueryTable queries = sdqes::load_queries(bundle);
  // Each query's policy as `sdqes-edge run` decides it: its own threshold, else --threshold, else the bundle's for
  // its label, else the default; the recorded hysteresis and cooldown unless the options say otherwise.
  const sdqes::PolicyOptions options = policy_options(o);
  std::vector<sdqes::AlertState> states;  // each policy checked here, before any engine is loaded
  for (size_t q = 0; q < queries.texts.size(); ++q) {
    states.emplace_back(sdqes::query_policy(bundle, queries.labels[q], queries.thresholds[q], options));
  }
  // -1: to the end of the source
  const int64_t max_frames = o.count("--max-frames") ? whole_number("--max-frames", o.at("--max-frames"), 1) : -1;
  std::vector<Source> sources;
  const double timeout_s = real_number(o, "--stream-timeout", sdqes::kStreamTimeoutS);
  if (timeout_s < sdqes::kStreamTimeoutMinS) {
    std::ostringstream words;
    words << "--stream-timeout needs at least " << sdqes::kStreamTimeoutMinS << " s, not '" << o.at("--stream-timeout")
          << "'";
    throw sdqes::Error(words.str());
  }
  for (const auto& spec : source_specs) sources.push_back(read_source(spec, source_specs.size() > 1, timeout_s));
  if (o.count("--stream-timeout") && std::none_of(source_specs.begin(), source_specs.end(), sdqes::is_stream_url)) {
    say("warning: --stream-timeout is for stream URLs (rtsp://, http://, udp://, tcp://), and no --source is one: "
        "ignored");
  }
  if (static_cast<int64_t>(sources.size()) > bundle.batch) {  // fewer is fine: the other streams idle
    throw sdqes::Error(std::to_string(sources.size()) + " sources but the bundle steps " +
                       std::to_string(bundle.batch) + " stream(s) at once; re-export with --batch " +
                       std::to_string(sources.size()));
  }
  if (o.count("--events")) sdqes::check_output_path(o.at("--events"), "--events", "alerts.jsonl", /*appended=*/true);
  std::optional<std::filesystem::path> state_path;
  if (o.count("--state")) {
    (void)sdqes::AlertStateFile(o.at("--state"));  // its folder checked before any engine is looked for
    state_path = o.at("--state");
  }
  // A second run on the same files is refused at once, before any engine loads (either runtime's).
  sdqes::reads_bundle(bundle_path);
  for (const auto& spec : source_specs) sdqes::reads_source(spec);
  if (o.count("--events")) sdqes::hold_output(o.at("--events"), "--events");
  if (state_path) sdqes::hold_output(*state_path, "--state");
  const std::string backend = o.count("--backend") ? o.at("--backend") : sdqes::default_backend();
  sdqes::check_backend(backend, "--backend");
  const std::string precision = o.count("--precision") ? o.at("--precision") : sdqes::default_precision(backend);
  if (precision != "fp16" && precision != "fp32" && precision != "int8") {  // not "build a fp64 engine"
    throw sdqes::Error("--precision " + precision + " is not one of fp16, fp32, int8");
  }
  // 0: ONNX Runtime's default, a thread per core
  const int64_t asked = o.count("--threads") ? whole_number("--threads", o.at("--threads"), 1) : 0;
  const int cores = sdqes::usable_cores();
  if (asked > 0 && backend == "tensorrt") {
    say("warning: --threads is for the ONNX Runtime backend; TensorRT steps on the GPU, so it is left out");
  } else if (asked > cores) {  // the Python runtime's words (cores.py)
    say("warning: " + std::to_string(asked) + " threads asked of ONNX Runtime, but this process may use " +
        std::to_string(cores) + " core(s); using " + std::to_string(cores) + " (more would only take turns on them)");
  }
  const int threads = static_cast<int>(std::min<int64_t>(asked, cores));
  say_thresholds_out_of_reach(states, queries);  // once nothing is refused, as `sdqes-edge run` says it
  sdqes::OpenedStep engine = sdqes::open_step(bundle, queries, backend, precision, threads);
  const std::string slow = sdqes::slow_precision_words(backend, precision, bundle_path);
  if (!slow.empty()) say("warning: " + slow);
#ifdef SDQES_CAN_STREAM
  return stream(bundle, queries, states, sources, engine, max_frames, o.count("--events") ? o.at("--events") : "",
                state_path);
#else
  (void)max_frames;
  return 2;  // not reached: open_step refused, there being no backend
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // A write past `ulimit -f` fails with EFBIG, said with what to do, as Python (which ignores the signal) has it:
  // the kernel's SIGXFSZ had ended the process, its outputs unfinished and no word but the shell's.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const SourceUnavailable& e) {
    say(std::string("error: ") + e.what());
    return 1;
  } catch (const sdqes::OutputRefused& e) {
    say(std::string("error: ") + e.what());
    return 1;
  } catch (const sdqes::Error& e) {
    say(std::string("error: ") + e.what());
    return 2;
  } catch (const std::exception& e) {
    say(std::string("error: ") + e.what());
    return 2;
  }
}
