#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <opencv2/core.hpp>

#include "sdqes/memory_file.hpp"
#include "sdqes/pacing.hpp"
#include "sdqes/runtime.hpp"
#include "sdqes/sdqes.h"
#include "sdqes/step_backend.hpp"

struct sdqes_bundle {
  sdqes::Bundle bundle;
  std::optional<sdqes::QueryTable> queries;  // none: why (a bundle exported without --query), for sdqes_step_open
  std::string no_queries;
  std::string trained_on;  // what its training record says the model was trained on ("" none)
};
struct sdqes_alert {
  explicit sdqes_alert(sdqes::AlertState policy_state) : state(std::move(policy_state)) {}
  sdqes::AlertState state;
  double last_time = -std::numeric_limits<double>::infinity();  // the stream time of the last update taken
  // Its times against the bundle's rate (sdqes_alert_for_label of a model with state); none for sdqes_alert_new,
  // which knows no rate, and for a model that sees each frame alone.
  std::optional<sdqes::StreamPace> pace;
};
struct sdqes_step {
  sdqes::OpenedStep opened;
  sdqes::QueryTable queries;
  sdqes::StreamBatch batch;               // B streams, each its frame (an idle one's zero)
  std::vector<float> probabilities;      // [B, Q] of the last step: an idle stream's row NaN
  std::vector<const float*> one_stream;  // sdqes_step_run's frames: the caller's as stream 0, the others idle
  // Held by every call that steps or resets: a caller's threads (a ROS 2 node's callbacks, one per camera) may share
  // a step, each call then whole, as the Python runtime's detector takes its lock.
  std::mutex busy;
};

namespace {
// Where warnings go (sdqes_set_warning_handler), and the texts said so far.
struct Warnings {
  std::mutex lock;
  std::set<std::string> said;
  sdqes_warning_handler handler = nullptr;  // nullptr: stderr
  void* user_data = nullptr;
};

Warnings& warnings() {
  static Warnings shared;
  return shared;
}

// A warning, as Python shows a warning a program has not filtered: each text once in the process (every query's
// alert of a stream finds the same problem at the same frame), on stderr or to the program's handler. The handler is
// called outside the lock: one that calls the library, which may warn again, would otherwise wait on itself.
void say_once(const std::string& warning) {
  Warnings& all = warnings();
  sdqes_warning_handler handler = nullptr;
  void* user_data = nullptr;
  {
    const std::lock_guard<std::mutex> held(all.lock);
    if (!all.said.insert(warning).second) return;
    handler = all.handler;
    user_data = all.user_data;
  }
  if (handler) {
    handler(warning.c_str(), user_data);
  } else {
    std::fprintf(stderr, "sdqes: warning: %s\n", warning.c_str());
  }
}

// A threshold no score reaches (the alert never alerts) or below every score (it alerts at the first frame alone), as
// `sdqes-edge run` and sdqes-run say it; said once on stderr, the alert made all the same (the caller's choice).
void say_if_out_of_reach(const sdqes::AlertPolicy& policy, const char* made_by) {
  const std::string why = sdqes::out_of_reach_words(policy.threshold, "it");
  if (why.empty()) return;
  std::ostringstream words;  // the threshold as Python's :g writes it
  words << made_by << ": the threshold " << policy.threshold << " " << why;
  say_once(words.str());
}

void set_error(char* error, size_t size, const char* message) {
  if (error && size) {
    std::strncpy(error, message, size - 1);
    error[size - 1] = '\0';
  }
}

// One step of every stream, frames[b] or NULL (idle: its state kept as the step found it, its row of probabilities
// NaN, so that a caller who reads it anyway sees that it was not stepped); with every stream idle, no step at all.
void step_streams(sdqes_step& step, const float* const* frames) {
  const size_t queries = step.queries.texts.size();
  std::fill(step.probabilities.begin(), step.probabilities.end(), std::numeric_limits<float>::quiet_NaN());
  auto& backend = *step.opened.backend;
  const auto* embedding = step.batch.step(backend, frames);
  if (embedding == nullptr) return;  // every stream idle: nothing stepped
  for (int b = 0; b < step.batch.streams(); ++b) {
    if (step.batch.idle(b)) continue;
    const auto probs = sdqes::query_probabilities(backend, *embedding, step.queries, b);
    std::copy(probs.begin(), probs.end(), step.probabilities.begin() + static_cast<std::ptrdiff_t>(b * queries));
  }
}
// `call` on the step, held whole (sdqes_step::busy): 0, or 1 and the reason where it throws.
template <typename Call>
int with_step_held(sdqes_step& step, char* error, size_t error_size, Call call) {
  try {
    const std::lock_guard<std::mutex> whole(step.busy);
    call();
    return 0;
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return 1;
  }
}

// A memory file's save or load (`name`): refused where the step or the path is NULL.
template <typename Call>
int memory_call(sdqes_step* step, const char* path, const char* name, char* error, size_t error_size, Call call) {
  if (!step || !path) {
    set_error(error, error_size, (std::string(!step ? "step" : "path") + " is NULL; give " + name + " the step " +
                                  "sdqes_step_open opened, a stream and a file path").c_str());
    return 1;
  }
  return with_step_held(*step, error, error_size, call);
}
}  // namespace

extern "C" {

const char* sdqes_version(void) { return SDQES_VERSION; }

void sdqes_set_warning_handler(sdqes_warning_handler handler, void* user_data) {
  Warnings& all = warnings();
  const std::lock_guard<std::mutex> held(all.lock);
  all.handler = handler;
  all.user_data = user_data;
}

sdqes_bundle* sdqes_bundle_open(const char* path, char* error, size_t error_size) {
  if (!path) {
    set_error(error, error_size, "bundle path is NULL; give the folder sdqes-edge export wrote");
    return nullptr;
  }
  try {
    auto opened = std::make_unique<sdqes_bundle>(sdqes_bundle{sdqes::load_bundle(path), std::nullopt, "", ""});
    opened->trained_on = sdqes::training_data_words(opened->bundle);
    const std::string random = sdqes::random_weights_words(opened->bundle.manifest);
    if (!random.empty()) say_once(sdqes::random_weights_warning(random));  // a preset's: measured, never alerted on
    try {
      opened->queries = sdqes::load_queries(opened->bundle);
    } catch (const sdqes::Error& e) {  // preprocessing and alerts need none; stepping does, and says so
      opened->no_queries = e.what();
    }
    return opened.release();
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

void sdqes_bundle_close(sdqes_bundle* bundle) { delete bundle; }
// A NULL bundle (one sdqes_bundle_open refused) reads as 0 rather than crashing the caller.
double sdqes_bundle_fps(const sdqes_bundle* b) { return b ? b->bundle.fps : 0.0; }
int sdqes_bundle_image_size(const sdqes_bundle* b) { return b ? b->bundle.image_size : 0; }
double sdqes_bundle_default_threshold(const sdqes_bundle* b) { return b ? b->bundle.default_threshold : 0.0; }
const char* sdqes_bundle_training_data(const sdqes_bundle* b) { return b ? b->trained_on.c_str() : ""; }

int sdqes_bundle_query_count(const sdqes_bundle* b) {
  return b && b->queries ? static_cast<int>(b->queries->texts.size()) : 0;
}

namespace {
const char* query_field(const sdqes_bundle* b, int query, std::vector<std::string> sdqes::QueryTable::*field) {
  if (query < 0 || query >= sdqes_bundle_query_count(b)) return nullptr;
  return ((*b->queries).*field)[static_cast<size_t>(query)].c_str();
}
}  // namespace

const char* sdqes_bundle_query_text(const sdqes_bundle* b, int query) {
  return query_field(b, query, &sdqes::QueryTable::texts);
}
const char* sdqes_bundle_query_message(const sdqes_bundle* b, int query) {
  return query_field(b, query, &sdqes::QueryTable::messages);
}
const char* sdqes_bundle_query_label(const sdqes_bundle* b, int query) {
  return query_field(b, query, &sdqes::QueryTable::labels);
}

namespace {

// sdqes_preprocess and sdqes_preprocess_rgb: `pixels` in the order `rgb` says, `name` the function's own.
int preprocess_into(const sdqes_bundle* b, const uint8_t* pixels, int height, int width, float* out, bool rgb,
                    const char* name, char* error, size_t error_size) {
  const char* missing = !b ? "bundle" : !pixels ? (rgb ? "rgb" : "bgr") : !out ? "out" : nullptr;
  if (missing) {
    set_error(error, error_size, (std::string(missing) + " is NULL; give " + name + " a bundle, a frame and "
                                  "3*R*R floats to write").c_str());
    return 1;
  }
  if (height < 1 || width < 1) {  // a negative one failed inside std::vector ("vector::_M_default_append")
    set_error(error, error_size, ("got an empty frame of height " + std::to_string(height) + " and width " +
                                  std::to_string(width) + "; give an image at least 1x1 pixel").c_str());
    return 1;
  }
  try {
    const cv::Mat frame(height, width, CV_8UC3, const_cast<uint8_t*>(pixels));
    const auto values = sdqes::preprocess(frame, b->bundle.image_size, b->bundle.preprocess, rgb);
    std::memcpy(out, values.data(), values.size() * sizeof(float));
    return 0;
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return 1;
  }
}

}  // namespace

int sdqes_preprocess(const sdqes_bundle* b, const uint8_t* bgr, int height, int width, float* out, char* error,
                     size_t error_size) {
  return preprocess_into(b, bgr, height, width, out, false, "sdqes_preprocess", error, error_size);
}

int sdqes_preprocess_rgb(const sdqes_bundle* b, const uint8_t* rgb, int height, int width, float* out, char* error,
                         size_t error_size) {
  return preprocess_into(b, rgb, height, width, out, true, "sdqes_preprocess_rgb", error, error_size);
}

sdqes_alert* sdqes_alert_new(double threshold, double exit_threshold, double cooldown_s, int max_alerts, char* error,
                             size_t error_size) {
  try {
    sdqes::AlertPolicy policy;
    policy.threshold = threshold;
    if (!(exit_threshold < 0)) policy.exit_threshold = exit_threshold;  // NaN is checked, not taken as unset
    policy.cooldown_s = cooldown_s;
    if (max_alerts >= 1) policy.max_alerts = max_alerts;
    auto alert = std::unique_ptr<sdqes_alert>(new sdqes_alert(sdqes::AlertState(policy)));  // the policy checked
    say_if_out_of_reach(policy, "sdqes_alert_new");
    return alert.release();
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

sdqes_alert* sdqes_alert_for_label(const sdqes_bundle* b, const char* label, char* error, size_t error_size) {
  if (!b) {
    set_error(error, error_size, "bundle is NULL; give sdqes_alert_for_label the bundle sdqes_bundle_open opened");
    return nullptr;
  }
  try {
    auto alert = std::unique_ptr<sdqes_alert>(
        new sdqes_alert(sdqes::AlertState(sdqes::query_policy(b->bundle, label ? label : "", std::nullopt, {}))));
    if (!b->bundle.state.empty()) alert->pace.emplace(1.0 / b->bundle.fps);
    say_if_out_of_reach(alert->state.policy(), "sdqes_alert_for_label");
    return alert.release();
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

int sdqes_alert_update(sdqes_alert* alert, double probability, double stream_time) {
  // Refused, the state unchanged: a NaN time let every later alert past the cooldown, and a time that went back (a
  // new stream on the same alert) kept the next alerts quiet until it passed the last alert's time again.
  if (!alert || !std::isfinite(probability) || !std::isfinite(stream_time) || stream_time < alert->last_time) {
    return -1;
  }
  alert->last_time = stream_time;
  if (alert->pace && alert->pace->observe(stream_time) != sdqes::StreamPace::Problem::kNone) {
    say_once(alert->pace->said());
  }
  return alert->state.update(probability, stream_time) ? 1 : 0;
}

const char* sdqes_alert_pace_problem(const sdqes_alert* alert) {
  return alert && alert->pace ? alert->pace->said().c_str() : "";
}

int sdqes_alert_reset(sdqes_alert* alert) {
  if (!alert) return -1;
  alert->state.reset();
  alert->last_time = -std::numeric_limits<double>::infinity();
  if (alert->pace) alert->pace->restart();
  return 0;
}

void sdqes_alert_free(sdqes_alert* alert) { delete alert; }

sdqes_step* sdqes_step_open(const sdqes_bundle* b, const char* backend, const char* precision, int threads,
                            char* error, size_t error_size) {
  if (!b) {
    set_error(error, error_size, "bundle is NULL; give sdqes_step_open the bundle sdqes_bundle_open opened");
    return nullptr;
  }
  if (!b->queries) {
    set_error(error, error_size, b->no_queries.c_str());
    return nullptr;
  }
  if (threads < 0) {
    set_error(error, error_size, ("threads is " + std::to_string(threads) + "; give 0 (one per core) or more").c_str());
    return nullptr;
  }
  try {
    const std::string on = backend ? backend : sdqes::default_backend();
    const std::string as = precision ? precision : sdqes::default_precision(on);
    const std::string slow = sdqes::slow_precision_words(on, as, b->bundle.root.string());
    const int streams = static_cast<int>(b->bundle.batch);
    auto step = std::unique_ptr<sdqes_step>(new sdqes_step{
        sdqes::open_step(b->bundle, *b->queries, on, as, threads), *b->queries,
        sdqes::StreamBatch(streams, 3 * static_cast<size_t>(b->bundle.image_size) * b->bundle.image_size),
        std::vector<float>(b->queries->texts.size() * streams), std::vector<const float*>(streams, nullptr), {}});
    if (!slow.empty()) say_once(slow);  // opened: the graph runs, slower than the caller chose it for
    return step.release();
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

int sdqes_step_run(sdqes_step* step, const float* frame, float* probabilities, char* error, size_t error_size) {
  const char* missing = !step ? "step" : !frame ? "frame" : !probabilities ? "probabilities" : nullptr;
  if (missing) {
    set_error(error, error_size, (std::string(missing) + " is NULL; give sdqes_step_run the step sdqes_step_open "
                                  "opened, a preprocessed frame and a float per query to write").c_str());
    return 1;
  }
  return with_step_held(*step, error, error_size, [&] {
    step->one_stream[0] = frame;
    step_streams(*step, step->one_stream.data());
    std::copy_n(step->probabilities.begin(), step->queries.texts.size(), probabilities);
  });
}

int sdqes_step_streams(const sdqes_step* step) { return step ? step->batch.streams() : 0; }

int sdqes_step_run_streams(sdqes_step* step, const float* const* frames, float* probabilities, char* error,
                           size_t error_size) {
  const char* missing = !step ? "step" : !frames ? "frames" : !probabilities ? "probabilities" : nullptr;
  if (missing) {
    set_error(error, error_size, (std::string(missing) + " is NULL; give sdqes_step_run_streams the step "
                                  "sdqes_step_open opened, sdqes_step_streams frames (NULL for a stream without "
                                  "one) and a float per stream and query to write").c_str());
    return 1;
  }
  return with_step_held(*step, error, error_size, [&] {
    step_streams(*step, frames);
    std::copy(step->probabilities.begin(), step->probabilities.end(), probabilities);
  });
}

int sdqes_step_reset(sdqes_step* step) {
  if (!step) return -1;
  const std::lock_guard<std::mutex> whole(step->busy);
  step->opened.backend->reset();
  return 0;
}

int sdqes_step_reset_stream(sdqes_step* step, int stream, char* error, size_t error_size) {
  if (!step) {
    set_error(error, error_size, "step is NULL; give sdqes_step_reset_stream the step sdqes_step_open opened");
    return 1;
  }
  return with_step_held(*step, error, error_size, [&] { step->opened.backend->reset_stream(stream); });
}

int sdqes_step_save_memory(sdqes_step* step, int stream, const char* path, char* error, size_t error_size) {
  return memory_call(step, path, "sdqes_step_save_memory", error, error_size,
                     [&] { sdqes::save_memory(path, step->opened, stream); });
}

int sdqes_step_load_memory(sdqes_step* step, int stream, const char* path, char* error, size_t error_size) {
  return memory_call(step, path, "sdqes_step_load_memory", error, error_size,
                     [&] { sdqes::load_memory(path, step->opened, stream); });
}

const char* sdqes_step_description(const sdqes_step* step) { return step ? step->opened.words.c_str() : ""; }

void sdqes_step_close(sdqes_step* step) { delete step; }

}  // extern "C"
