#include <cstring>
#include <string>

#include <opencv2/core.hpp>

#include "sdqes/runtime.hpp"
#include "sdqes/sdqes.h"

struct sdqes_bundle {
  sdqes::Bundle bundle;
};
struct sdqes_alert {
  sdqes::AlertState state;
};

namespace {
void set_error(char* error, size_t size, const char* message) {
  if (error && size) {
    std::strncpy(error, message, size - 1);
    error[size - 1] = '\0';
  }
}
}  // namespace

extern "C" {

sdqes_bundle* sdqes_bundle_open(const char* path, char* error, size_t error_size) {
  if (!path) {
    set_error(error, error_size, "bundle path is NULL; give the folder sdqes-edge export wrote");
    return nullptr;
  }
  try {
    return new sdqes_bundle{sdqes::load_bundle(path)};
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

int sdqes_preprocess(const sdqes_bundle* b, const uint8_t* bgr, int height, int width, float* out, char* error,
                     size_t error_size) {
  const char* missing = !b ? "bundle" : !bgr ? "bgr" : !out ? "out" : nullptr;
  if (missing) {
    set_error(error, error_size, (std::string(missing) + " is NULL; give sdqes_preprocess a bundle, a frame and "
                                  "3*R*R floats to write").c_str());
    return 1;
  }
  try {
    const cv::Mat frame(height, width, CV_8UC3, const_cast<uint8_t*>(bgr));
    const auto values = sdqes::preprocess(frame, b->bundle.image_size, b->bundle.preprocess);
    std::memcpy(out, values.data(), values.size() * sizeof(float));
    return 0;
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return 1;
  }
}

sdqes_alert* sdqes_alert_new(double threshold, double exit_threshold, double cooldown_s, int max_alerts, char* error,
                             size_t error_size) {
  try {
    sdqes::AlertPolicy policy;
    policy.threshold = threshold;
    if (!(exit_threshold < 0)) policy.exit_threshold = exit_threshold;  // NaN is checked, not taken as unset
    policy.cooldown_s = cooldown_s;
    if (max_alerts >= 1) policy.max_alerts = max_alerts;
    return new sdqes_alert{sdqes::AlertState(policy)};
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
    return new sdqes_alert{sdqes::AlertState(sdqes::query_policy(b->bundle, label ? label : "", std::nullopt, {}))};
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

int sdqes_alert_update(sdqes_alert* alert, double probability, double stream_time) {
  if (!alert) return -1;
  return alert->state.update(probability, stream_time) ? 1 : 0;
}

void sdqes_alert_free(sdqes_alert* alert) { delete alert; }

}  // extern "C"
