/* A C caller's streaming loop over libsdqes (native/include/sdqes/sdqes.h), in C99: raw BGR frames on stdin, one
 * per sample time of the bundle (its fps), each preprocessed, stepped with the state carried, and its queries'
 * probabilities put through their alert policies. For example:
 *
 *   ffmpeg -loglevel error -i kitchen.mp4 -vf fps=5 -f rawvideo -pix_fmt bgr24 - |
 *     build/sdqes-stream-frames bundles/qrnn 640 480
 *
 * Arguments: BUNDLE WIDTH HEIGHT [THRESHOLD] [BACKEND]. THRESHOLD: one for every query (default: each query's
 * policy as the bundle records it, as sdqes-run gives it); BACKEND: tensorrt or onnxruntime (default: the first
 * this library was built with). Each alert is one line on stdout, "<stream time s> <query> <p> <message>"; a
 * problem is one line on stderr and exit status 2; the library's warnings are lines on stderr in this program's name,
 * as a program hands them to its own log. */
#include <stdio.h>
#include <stdlib.h>

#include "sdqes/sdqes.h"

#define ERROR_SIZE 512

static char program[] = "sdqes-stream-frames";

/* sdqes_set_warning_handler's handler: a ROS 2 node would call RCLCPP_WARN here. */
static void warn(const char* warning, void* name) {
  fprintf(stderr, "%s: warning: %s\n", (const char*)name, warning);
}

static int fail(const char* what, const char* why) {
  fprintf(stderr, "sdqes-stream-frames: error: %s: %s\n", what, why);
  return 2;
}

int main(int argc, char** argv) {
  char error[ERROR_SIZE] = "";
  if (argc < 4 || argc > 6) {
    fprintf(stderr, "usage: %s BUNDLE WIDTH HEIGHT [THRESHOLD] [BACKEND] < raw BGR frames\n", argv[0]);
    return 2;
  }
  sdqes_set_warning_handler(warn, program);
  const int width = atoi(argv[2]), height = atoi(argv[3]);
  if (width <= 0 || height <= 0) return fail("WIDTH and HEIGHT", "give the frames' size in pixels, e.g. 640 480");
  sdqes_bundle* bundle = sdqes_bundle_open(argv[1], error, sizeof error);
  if (!bundle) return fail(argv[1], error);
  sdqes_step* step = sdqes_step_open(bundle, argc > 5 ? argv[5] : NULL, NULL, 0, error, sizeof error);
  if (!step) return fail("the step graph", error);
  const int queries = sdqes_bundle_query_count(bundle), size = sdqes_bundle_image_size(bundle);
  sdqes_alert** alerts = calloc((size_t)queries, sizeof *alerts);
  for (int q = 0; q < queries; ++q) {
    alerts[q] = argc > 4 ? sdqes_alert_new(atof(argv[4]), -1.0, 0.0, 0, error, sizeof error)
                         : sdqes_alert_for_label(bundle, sdqes_bundle_query_label(bundle, q), error, sizeof error);
    if (!alerts[q]) return fail("the alert policy", error);
  }
  fprintf(stderr, "sdqes-stream-frames: %d queries, %dx%d frames at %g fps (%s)\n", queries, width, height,
          sdqes_bundle_fps(bundle), sdqes_step_description(step));
  if (*sdqes_bundle_training_data(bundle)) {
    fprintf(stderr, "sdqes-stream-frames: note: this model was trained on %s only; on other footage its alerts mean "
            "little\n", sdqes_bundle_training_data(bundle));
  }
  const size_t frame_bytes = (size_t)width * (size_t)height * 3;
  unsigned char* bgr = malloc(frame_bytes);
  float* frame = malloc(sizeof(float) * 3 * (size_t)size * (size_t)size);
  float* probabilities = malloc(sizeof(float) * (size_t)(queries > 0 ? queries : 1));
  long frames = 0;
  while (fread(bgr, 1, frame_bytes, stdin) == frame_bytes) {
    const double time = (double)frames / sdqes_bundle_fps(bundle);
    if (sdqes_preprocess(bundle, bgr, height, width, frame, error, sizeof error) != 0) return fail("a frame", error);
    if (sdqes_step_run(step, frame, probabilities, error, sizeof error) != 0) return fail("a step", error);
    for (int q = 0; q < queries; ++q) {
      if (sdqes_alert_update(alerts[q], probabilities[q], time) == 1) {
        printf("%.3f %d %.6f %s\n", time, q, probabilities[q], sdqes_bundle_query_message(bundle, q));
        fflush(stdout);
      }
    }
    ++frames;
  }
  fprintf(stderr, "sdqes-stream-frames: done: %ld frames\n", frames);
  for (int q = 0; q < queries; ++q) sdqes_alert_free(alerts[q]);
  free(alerts);
  free(bgr);
  free(frame);
  free(probabilities);
  sdqes_step_close(step);
  sdqes_bundle_close(bundle);
  return 0;
}
