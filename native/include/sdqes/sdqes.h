/* sdqes native runtime: a small C API over the C++ library, so other languages can bind.
 * Every function that can fail returns 0 on success and writes a one-line reason into `error`.
 * NULL handles are refused, never dereferenced: the getters then return 0. */
#ifndef SDQES_H
#define SDQES_H

#include <stddef.h>
#include <stdint.h>

/* libsdqes.so exports these functions alone; the C++ library inside it is hidden. */
#if defined(__GNUC__)
#define SDQES_API __attribute__((visibility("default")))
#else
#define SDQES_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sdqes_bundle sdqes_bundle;
typedef struct sdqes_alert sdqes_alert;
typedef struct sdqes_step sdqes_step;

/* The sdqes-edge release this library was built from ("0.1.0"), as `sdqes-edge --version` says it: a program's log
 * line, or a check that the library is the one its bundles were exported for. */
SDQES_API const char* sdqes_version(void);

/* Where the library's warnings go: the problems a caller may go on with (a threshold no score reaches, frames that come
 * faster than the bundle's rate, the fp16 graph on the CPU, a model with random weights), each text once in the
 * process. By default they are written on stderr ("sdqes: warning: ..."). A program with a log of its own (a ROS 2
 * node's RCLCPP_WARN, syslog, journald) takes them there instead: `handler` is called with each warning's text (one
 * line, without the "sdqes: warning: " prefix) and `user_data`, on the thread of the call that found the problem, so
 * from several threads at once where several share the library; it may call this library. NULL goes back to stderr.
 * A text said before the handler was set is not said again. */
typedef void (*sdqes_warning_handler)(const char* warning, void* user_data);
SDQES_API void sdqes_set_warning_handler(sdqes_warning_handler handler, void* user_data);

SDQES_API sdqes_bundle* sdqes_bundle_open(const char* path, char* error, size_t error_size);
SDQES_API void sdqes_bundle_close(sdqes_bundle* bundle);
SDQES_API double sdqes_bundle_fps(const sdqes_bundle* bundle);
SDQES_API int sdqes_bundle_image_size(const sdqes_bundle* bundle);
SDQES_API double sdqes_bundle_default_threshold(const sdqes_bundle* bundle);
/* What the bundle's model was trained on, where the training record `sdqes-edge train` wrote into it says so, in the
 * words `sdqes-edge run` and sdqes-run note it with ("synthetic scenes (...), 120 training streams" for the demo's
 * model, whose alerts on other footage mean little); "" for a model without one, and for NULL. */
SDQES_API const char* sdqes_bundle_training_data(const sdqes_bundle* bundle);

/* The queries encoded into the bundle (sdqes-edge export --query TEXT[=MESSAGE]), in its order: how many, and each
 * one's text, alert message and label ("" where it has none); NULL for an index out of range. The native runtime
 * has no text encoder: these are the queries it scores. */
SDQES_API int sdqes_bundle_query_count(const sdqes_bundle* bundle);
SDQES_API const char* sdqes_bundle_query_text(const sdqes_bundle* bundle, int query);
SDQES_API const char* sdqes_bundle_query_message(const sdqes_bundle* bundle, int query);
SDQES_API const char* sdqes_bundle_query_label(const sdqes_bundle* bundle, int query);

/* BGR uint8 frame [height, width, 3] (as OpenCV decodes it) -> normalized float32 [3, R, R] into `out` (3*R*R
 * floats). */
SDQES_API int sdqes_preprocess(const sdqes_bundle* bundle, const uint8_t* bgr, int height, int width, float* out,
                               char* error, size_t error_size);
/* The same of an RGB frame (a ROS 2 sensor_msgs/Image of encoding rgb8, most cameras' SDKs): the same floats as its
 * BGR twin. Given to sdqes_preprocess, an RGB frame runs without an error and scores otherwise (red seen as blue). */
SDQES_API int sdqes_preprocess_rgb(const sdqes_bundle* bundle, const uint8_t* rgb, int height, int width, float* out,
                                   char* error, size_t error_size);

/* Alert policy; exit_threshold < 0 and max_alerts < 1 mean "unset" (a NaN is refused, as in Python). */
SDQES_API sdqes_alert* sdqes_alert_new(double threshold, double exit_threshold, double cooldown_s, int max_alerts,
                                       char* error, size_t error_size);
/* The policy a query of `label` alerts under, as `sdqes-edge run` and sdqes-run give it: the bundle's threshold for
 * the label (NULL or "": no label) else its default, with the hysteresis and cooldown that `sdqes-edge eval
 * --calibrate-policy` recorded in it. sdqes_alert_new's numbers leave a calibrated bundle's choices behind. */
SDQES_API sdqes_alert* sdqes_alert_for_label(const sdqes_bundle* bundle, const char* label, char* error,
                                             size_t error_size);
/* Feed one frame's probability at its stream time (seconds, never going back): 1 alert now, 0 no alert, -1 refused
 * with the alert unchanged: alert is NULL, probability or stream_time is not finite, or stream_time is earlier than
 * the last one's (a new stream: sdqes_alert_reset first, or its cooldown would keep it quiet until the time passed
 * the last alert's again). */
SDQES_API int sdqes_alert_update(sdqes_alert* alert, double probability, double stream_time);
/* Whether the times given sdqes_alert_update come at the bundle's rate, for an alert of sdqes_alert_for_label of a
 * model with state (its adapters were trained on frames 1 / fps seconds apart): "" while they do, else one line that
 * says how they do not and what to give, as the Python runtime's FrameRateWarning says it. Over the last 8 intervals:
 * frames clearly faster (their mean under 0.8 of the period: a camera's every frame), frames that keep one time, or
 * each over 100 periods apart (times in milliseconds, where a 10 s cooldown passed in 10 ms). Found once, it stays,
 * and is also said once as a warning (sdqes_set_warning_handler). Always "" for sdqes_alert_new (it knows no rate). */
SDQES_API const char* sdqes_alert_pace_problem(const sdqes_alert* alert);
/* A new stream: no run above the threshold, no alert counted, no cooldown, times from anew. 0, or -1 if NULL. */
SDQES_API int sdqes_alert_reset(sdqes_alert* alert);
SDQES_API void sdqes_alert_free(sdqes_alert* alert);

/* The bundle's step graph, ready to stream, its state at the start of a stream, as sdqes-run steps it: backend
 * "tensorrt" (the engine sdqes-edge build-engine built for this GPU) or "onnxruntime" (the ONNX graph on the CPU),
 * NULL: TensorRT where this library was built with it, else ONNX Runtime; precision "fp16", "fp32" or "int8", NULL:
 * fp16 on TensorRT, fp32 on ONNX Runtime (fp16 there opens, said once as a warning: on the CPU it is no faster than
 * fp32); threads: ONNX Runtime's (0: one per core; more than the cores this
 * process may use are brought down to them). It keeps what it needs of the
 * bundle, which may be closed after. Threads may share a step: each call that steps or resets it runs whole, one at a
 * time, and sdqes_step_close comes after the others' last call. (A call steps the whole graph: one call with every
 * camera's frame costs what one with a single camera's does.) */
SDQES_API sdqes_step* sdqes_step_open(const sdqes_bundle* bundle, const char* backend, const char* precision,
                                      int threads, char* error, size_t error_size);
/* One frame (sdqes_preprocess's 3*R*R floats) stepped, the state carried to the next call: `probabilities` gets
 * p = sigmoid(cos) of each of the bundle's queries (sdqes_bundle_query_count floats), what sdqes_alert_update takes.
 * A bundle exported for several streams steps the frame as its first, the others idle (their state kept). */
SDQES_API int sdqes_step_run(sdqes_step* step, const float* frame, float* probabilities, char* error,
                             size_t error_size);
/* The streams one step steps (sdqes-edge export --batch B; 1 unless exported so); 0 for NULL. */
SDQES_API int sdqes_step_streams(const sdqes_step* step);
/* One step of every stream (several cameras, one graph): frames[b] is stream b's preprocessed frame, or NULL where
 * stream b has none now (a camera between frames, a slot not in use), whose state is then kept as it was.
 * `probabilities` gets B rows of sdqes_bundle_query_count floats, stream by stream; an idle stream's row is NaN. */
SDQES_API int sdqes_step_run_streams(sdqes_step* step, const float* const* frames, float* probabilities,
                                     char* error, size_t error_size);
/* Back to the state at the start of a stream (a new video, a camera that came back). -1: step is NULL. */
SDQES_API int sdqes_step_reset(sdqes_step* step);
/* The same for one stream (0 to B-1) alone, the others' state kept. */
SDQES_API int sdqes_step_reset_stream(sdqes_step* step, int stream, char* error, size_t error_size);
/* The model's memory of `stream` (its rows of every state tensor, as the next step reads them) written to `path`,
 * atomically, with what it belongs to: a service that saves it (on a timer, at exit) and loads it when it starts again
 * goes on with its temporal adapters warm instead of from one frame. The file sdqes-run --state keeps beside each
 * stream's alert states (state.memory). */
SDQES_API int sdqes_step_save_memory(sdqes_step* step, int stream, const char* path, char* error, size_t error_size);
/* Memory sdqes_step_save_memory wrote, given to `stream` (any stream of a step of the same model and graph: a camera
 * may move to another slot). Memory kept by the model's graph of the other precision (fp16, fp32) is converted. One
 * of another model or export, or damaged, is refused with the reason, and the step is left as it was. */
SDQES_API int sdqes_step_load_memory(sdqes_step* step, int stream, const char* path, char* error, size_t error_size);
/* What runs it, for a log line ("ONNX Runtime 1.32.0 on the CPU, step.fp32.onnx"); "" for NULL. */
SDQES_API const char* sdqes_step_description(const sdqes_step* step);
SDQES_API void sdqes_step_close(sdqes_step* step);

#ifdef __cplusplus
}
#endif
#endif
