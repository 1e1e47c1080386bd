/* sdqes native runtime: a small C API over the C++ library, so other languages can bind.
 * Every function that can fail returns 0 on success and writes a one-line reason into `error`.
 * NULL handles are refused, never dereferenced: the getters then return 0. */
#ifndef SDQES_H
#define SDQES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sdqes_bundle sdqes_bundle;
typedef struct sdqes_alert sdqes_alert;

sdqes_bundle* sdqes_bundle_open(const char* path, char* error, size_t error_size);
void sdqes_bundle_close(sdqes_bundle* bundle);
double sdqes_bundle_fps(const sdqes_bundle* bundle);
int sdqes_bundle_image_size(const sdqes_bundle* bundle);
double sdqes_bundle_default_threshold(const sdqes_bundle* bundle);

/* BGR uint8 frame [height, width, 3] -> normalized float32 [3, R, R] into `out` (3*R*R floats). */
int sdqes_preprocess(const sdqes_bundle* bundle, const uint8_t* bgr, int height, int width, float* out,
                     char* error, size_t error_size);

/* Alert policy; exit_threshold < 0 and max_alerts < 1 mean "unset" (a NaN is refused, as in Python). */
sdqes_alert* sdqes_alert_new(double threshold, double exit_threshold, double cooldown_s, int max_alerts,
                             char* error, size_t error_size);
/* The policy a query of `label` alerts under, as `sdqes-edge run` and sdqes-run give it: the bundle's threshold for
 * the label (NULL or "": no label) else its default, with the hysteresis and cooldown that `sdqes-edge eval
 * --calibrate-policy` recorded in it. sdqes_alert_new's numbers leave a calibrated bundle's choices behind. */
sdqes_alert* sdqes_alert_for_label(const sdqes_bundle* bundle, const char* label, char* error, size_t error_size);
/* 1: alert now, 0: no alert, -1: alert is NULL */
int sdqes_alert_update(sdqes_alert* alert, double probability, double stream_time);
void sdqes_alert_free(sdqes_alert* alert);

#ifdef __cplusplus
}
#endif
#endif
