// sdqes-run: `sdqes-edge run` for C++ robots, on a bundle's TensorRT engine.
//   sdqes-run BUNDLE --source VIDEO|CAMERA_INDEX [--precision fp16] [--threshold X] [--exit-threshold X]
//             [--cooldown S] [--max-alerts K] [--events FILE] [--max-frames N]
// Queries come pre-encoded in the bundle (sdqes-edge export --query ...). A user's mistake is one line on
// stderr and exit code 2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <string>

#include <opencv2/videoio.hpp>

#include "sdqes/runtime.hpp"
#ifdef SDQES_WITH_TENSORRT
#include "sdqes/tensorrt_backend.hpp"
#endif

namespace {

const char* kUsage =
    "usage: sdqes-run BUNDLE --source VIDEO|CAMERA_INDEX [--precision fp16|fp32|int8] [--threshold X]\n"
    "                 [--exit-threshold X] [--cooldown S] [--max-alerts K] [--events FILE] [--max-frames N]\n";

std::map<std::string, std::string> parse(int argc, char** argv, std::string& bundle) {
  std::map<std::string, std::string> options{{"--precision", "fp16"}};
  const std::map<std::string, bool> known{{"--source", true}, {"--precision", true}, {"--threshold", true},
                                          {"--exit-threshold", true}, {"--cooldown", true}, {"--max-alerts", true},
                                          {"--events", true}, {"--max-frames", true}};
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
  if (!options.count("--source")) throw sdqes::Error("give --source VIDEO or a camera index");
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
  const std::string source = o.at("--source");
  const bool camera = !source.empty() && source.find_first_not_of("0123456789") == std::string::npos;
  const int camera_index = camera ? static_cast<int>(std::min<int64_t>(whole_number("--source", source, 0),
                                                                       std::numeric_limits<int>::max()))
                                  : -1;
  // What alerts call the source (the JSONL `stream`), as `sdqes-edge run` calls it; a URL's password never shown.
  const std::string stream_name = camera ? sdqes::camera_name(camera_index) : sdqes::source_name(source);
  const std::string shown = sdqes::without_password(source);
  const std::string precision = o.at("--precision");
  if (precision != "fp16" && precision != "fp32" && precision != "int8") {  // not "build a fp64 engine"
    throw sdqes::Error("--precision " + precision + " is not one of fp16, fp32, int8");
  }
#ifndef SDQES_WITH_TENSORRT
  (void)sdqes::find_engine(bundle, precision);  // a bundle without any engine says how to build one first
  throw sdqes::Error("this sdqes-run was built without the TensorRT backend (CMake found no TensorRT/CUDA); "
                     "build it on the NVIDIA device with TensorRT installed");
#else
  // The engine built for this GPU and this TensorRT, by its sidecar: a bundle may carry engines for several.
  const auto engine = sdqes::find_engine(bundle, precision, sdqes::current_engine_target());
  cv::VideoCapture capture;
  camera ? capture.open(camera_index) : capture.open(source);
  if (!capture.isOpened()) throw sdqes::Error("OpenCV cannot open " + shown + "; check the file plays or the camera");
  sdqes::TensorRTStep step(engine, bundle);
  step.warm_up();  // before the first frame: its latency is a steady one
  std::unique_ptr<sdqes::JsonlSink> sink;
  if (o.count("--events")) sink = std::make_unique<sdqes::JsonlSink>(o.at("--events"));
  const double period = 1.0 / bundle.fps;
  // Sample times k / fps, each served by the first frame at or after it (runtime/sampling.py). A file's frame is
  // repeated where the video is slower than the bundle; a camera's steps once, the sample times it missed skipped.
  const double native_fps = camera ? 0.0 : capture.get(cv::CAP_PROP_FPS);
  const double end_time = camera ? std::numeric_limits<double>::infinity()
                                 : sdqes::stated_end_time(capture.get(cv::CAP_PROP_FRAME_COUNT), native_fps);
  if (native_fps > 0 && native_fps < bundle.fps) {
    std::cerr << "sdqes-run: note: " << shown << " has " << native_fps << " frames per second, fewer than the "
              << bundle.fps << " the bundle samples: each frame is repeated for the sample times it covers"
              << std::endl;
  }
  int64_t next_sample = 0;  // the first sample time k / fps not yet served
  int64_t index = 0;        // frames stepped
  bool enough = false;
  const auto start = std::chrono::steady_clock::now();
  cv::Mat image;
  const sdqes::StopOnSignal stop;  // Ctrl-C, docker stop, systemd: the frame in hand is finished, then the loop ends
  while (!enough && !stop.requested() && capture.grab()) {
    const double stamp = camera ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                                : capture.get(cv::CAP_PROP_POS_MSEC) / 1000.0;
    const int64_t served = sdqes::samples_served(stamp, next_sample, period, end_time);
    if (served == 0) continue;
    next_sample += served;
    const int64_t count = camera ? 1 : served;
    capture.retrieve(image);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> batch = sdqes::preprocess(image, bundle.image_size, bundle.preprocess);
    batch.resize(batch.size() * bundle.batch, 0.0f);  // extra stream slots idle
    for (int64_t served = 0; served < count && !enough; ++served) {
      const double time = camera ? stamp : index * period;
      const auto& embedding = step.step(batch);
      const auto probs = sdqes::probabilities(embedding.data(), queries);
      const double latency = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (size_t q = 0; q < probs.size(); ++q) {
        if (!std::isfinite(probs[q])) throw sdqes::Error("the model produced a non-finite score; stopping the stream");
        if (states[q].update(probs[q], time)) {
          sdqes::AlertEvent e{"q" + std::to_string(q + 1), queries.texts[q], queries.messages[q], stream_name, time,
                              index, probs[q], std::log(probs[q] / (1 - probs[q])), latency,
                              states[q].policy().threshold};
          if (!queries.labels[q].empty()) e.label = queries.labels[q];
          if (sink) sink->write(e);  // first: a closed stdout (`| head`) ends the process by SIGPIPE at the print
          std::cout << "[" << time << " s] " << e.message << "  (p=" << e.score << ")" << std::endl;
        }
      }
      ++index;
      enough = max_frames > 0 && index >= max_frames;
    }
  }
  if (stop.requested()) {
    std::cerr << "sdqes-run: interrupted (" << stop.signal_name() << ") after " << index << " frames"
              << std::endl;
    return stop.exit_code();
  }
  if (camera && !enough) {  // a camera never ends: it went away; a failure, so a service manager starts it again
    std::cerr << "sdqes-run: error: camera " << camera_index << " stopped sending frames after " << index
              << " frames: the stream ended there, every output complete (exit status 1)" << std::endl;
    return 1;
  }
  std::cerr << "done: " << index << " frames" << std::endl;
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const sdqes::Error& e) {
    std::cerr << "sdqes-run: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "sdqes-run: error: " << e.what() << std::endl;
    return 2;
  }
}
