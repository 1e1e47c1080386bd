// sdqes-run reads a live source on a thread of its own, newest frame wins (sdqes/live_reader.hpp): the twin of the
// Python runtime's reader thread (runtime/frame_source.py), on a scripted camera.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sdqes/live_reader.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const auto kNeverStopped = [] { return false; };

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A camera that sends a frame every `frame_period` (each frame's one pixel is its number), stops sending after
// `stop_after` frames of each connection (0: never), and opens again on the attempts `reopens_from` on (0: never).
struct ScriptedCamera {
  std::chrono::milliseconds frame_period{5};
  int stop_after = 0;
  int reopens_from = 0;
  std::chrono::milliseconds grab_blocks_for{0};  // a stalled stream: the read OpenCV blocks in
  bool grab_throws = false;
  std::atomic<int> grabs{0};  // reads begun
  std::atomic<int> sent{0};
  std::atomic<int> sent_since_open{0};
  std::atomic<int> open_attempts{0};
};

std::shared_ptr<sdqes::LiveCapture> capture_of(const std::shared_ptr<ScriptedCamera>& camera) {
  auto capture = std::make_shared<sdqes::LiveCapture>();
  capture->grab = [camera] {
    ++camera->grabs;
    if (camera->grab_throws) throw std::runtime_error("VIDEOIO(V4L2): can't dequeue buffer");
    std::this_thread::sleep_for(camera->grab_blocks_for + camera->frame_period);
    if (camera->stop_after > 0 && camera->sent_since_open >= camera->stop_after) return false;
    ++camera->sent_since_open;
    ++camera->sent;
    return true;
  };
  capture->retrieve = [camera](cv::Mat& image) {
    image = cv::Mat(1, 1, CV_32S, cv::Scalar(camera->sent.load()));
    return true;
  };
  capture->reopen = [camera] {
    const int attempt = ++camera->open_attempts;
    if (camera->reopens_from == 0 || attempt < camera->reopens_from) return false;
    camera->sent_since_open = 0;
    return true;
  };
  return capture;
}

// What the reader said, from its thread.
struct Said {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> log() {
    return [this](const std::string& line) {
      const std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
  }
};

sdqes::LatestFrame::Frame numbered(int number, double stamp) {
  sdqes::LatestFrame::Frame frame;
  frame.image = cv::Mat(1, 1, CV_32S, cv::Scalar(number));
  frame.stamp = stamp;
  return frame;
}

}  // namespace

TEST(LatestFrame, AFrameNotYetTakenIsReplacedByTheNewerOneAndCountedAsDropped) {
  sdqes::LatestFrame frames;
  for (int k = 0; k < 3; ++k) frames.put(numbered(k, 0.1 * k));
  frames.finish(false);
  sdqes::LatestFrame::Frame frame;
  ASSERT_TRUE(frames.take(frame, kNeverStopped));  // the frame put before the end is still handed over
  EXPECT_EQ(frame.image.at<int>(0), 2);
  EXPECT_DOUBLE_EQ(frame.stamp, 0.2);
  EXPECT_EQ(frames.dropped(), 2);
  EXPECT_FALSE(frames.take(frame, kNeverStopped));  // then the end
  EXPECT_FALSE(frames.lost());
}

TEST(LatestFrame, ALoopWaitingForAFrameStopsWhenAskedAndARaisedErrorReachesIt) {
  sdqes::LatestFrame frames;
  sdqes::LatestFrame::Frame frame;
  const auto start = Clock::now();
  EXPECT_FALSE(frames.take(frame, [start] { return Clock::now() - start > 100ms; }));  // Ctrl-C, no frame coming
  EXPECT_LT(Clock::now() - start, 1s);
  frames.put(numbered(7, 0.0));
  frames.finish(false, std::make_exception_ptr(std::runtime_error("can't dequeue buffer")));
  ASSERT_TRUE(frames.take(frame, kNeverStopped));
  EXPECT_THROW(frames.take(frame, kNeverStopped), std::runtime_error);
}

TEST(LatestFrame, AFilesFrameWaitsForTheOneBeforeToBeTakenAndAClosedLoopTakesNone) {
  sdqes::LatestFrame frames;
  ASSERT_TRUE(frames.put_waiting(numbered(1, 0.0)));
  std::atomic<bool> second_in{false};
  std::thread reader([&] { second_in = frames.put_waiting(numbered(2, 0.0)); });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(second_in) << "a file's frame replaced the one not yet taken";
  sdqes::LatestFrame::Frame frame;
  ASSERT_TRUE(frames.take(frame, kNeverStopped));
  EXPECT_EQ(frame.image.at<int>(0), 1);
  reader.join();
  EXPECT_TRUE(second_in);
  std::thread waiting([&] { second_in = frames.put_waiting(numbered(3, 0.0)); });  // frame 2 still not taken
  std::this_thread::sleep_for(20ms);
  frames.close();  // the run ends (Ctrl-C, --max-frames): the reader stops waiting
  waiting.join();
  EXPECT_FALSE(second_in);
  EXPECT_EQ(frames.dropped(), 0);
}

TEST(LiveReader, EachSampledFrameIsPreparedOnTheReadersThreadAndItsImageReleased) {
  auto camera = std::make_shared<ScriptedCamera>();
  auto capture = capture_of(camera);
  std::atomic<std::thread::id> prepared_on{};
  capture->prepare = [&prepared_on](const cv::Mat& image) {
    prepared_on = std::this_thread::get_id();
    return std::vector<float>{static_cast<float>(image.at<int>(0)), 0.5f};
  };
  sdqes::LiveReader reader(capture, "cam", 0.01, [](const std::string&) {});
  sdqes::LatestFrame::Frame frame;
  ASSERT_TRUE(reader.frames().take(frame, kNeverStopped));
  ASSERT_EQ(frame.prepared.size(), 2u);
  EXPECT_GE(frame.prepared[0], 1.0f);
  EXPECT_TRUE(frame.image.empty());
  EXPECT_NE(prepared_on.load(), std::this_thread::get_id());
}

TEST(LiveReader, ALoopSlowerThanTheCameraStepsOnTheNewestFrameNeverFallingBehind) {
  auto camera = std::make_shared<ScriptedCamera>();  // 200 frames a second, sampled at 100
  const auto start = Clock::now();
  sdqes::LiveReader reader(capture_of(camera), "cam", 0.01, [](const std::string&) {});
  const auto step = 100ms;  // an engine ten times slower than the samples
  int last = 0;
  for (int k = 0; k < 6; ++k) {
    sdqes::LatestFrame::Frame frame;
    ASSERT_TRUE(reader.frames().take(frame, kNeverStopped));
    EXPECT_GT(frame.image.at<int>(0), last);
    last = frame.image.at<int>(0);
    // Read on the loop's thread, each frame waited in the capture's buffer a step longer than the one before.
    EXPECT_LT(seconds_since(start) - frame.stamp, 0.1) << "step " << k << ": the frame stepped on is stale";
    std::this_thread::sleep_for(step);
  }
  EXPECT_GT(reader.frames().dropped(), 10);
}

TEST(LiveReader, ACameraThatStopsSendingIsReopenedAndItsFramesGoOn) {
  auto camera = std::make_shared<ScriptedCamera>();
  camera->stop_after = 3;
  camera->reopens_from = 1;
  Said said;
  sdqes::LiveReader reader(capture_of(camera), "cam", 0.001, said.log(), {0.01, 0.02});
  int last = 0;
  for (int k = 0; k < 5; ++k) {  // more frames than one connection sends
    sdqes::LatestFrame::Frame frame;
    ASSERT_TRUE(reader.frames().take(frame, kNeverStopped));
    EXPECT_GT(frame.image.at<int>(0), last);
    last = frame.image.at<int>(0);
  }
  const std::lock_guard<std::mutex> lock(said.mutex);
  ASSERT_GE(said.lines.size(), 2u);
  EXPECT_EQ(said.lines[0], "cam: no frame; reconnecting in 0.01 s (attempt 1 of 2)");
  EXPECT_EQ(said.lines[1], "cam: reconnected");
}

TEST(LiveReader, ACameraThatNeverComesBackEndsTheFramesAsLost) {
  auto camera = std::make_shared<ScriptedCamera>();
  camera->stop_after = 2;
  Said said;
  sdqes::LiveReader reader(capture_of(camera), "cam", 0.001, said.log(), {0.01, 0.01});
  sdqes::LatestFrame::Frame frame;
  int taken = 0;
  while (reader.frames().take(frame, kNeverStopped)) ++taken;
  EXPECT_GE(taken, 1);
  EXPECT_TRUE(reader.frames().lost());
  EXPECT_EQ(camera->open_attempts, 2);
  const std::lock_guard<std::mutex> lock(said.mutex);
  EXPECT_EQ(said.lines.back(), "cam: gave up after 2 attempts");
}

TEST(LiveReader, CamerasOfARunKeepTryingWhileOneSendsAndGiveUpTogetherOnceAllAreLost) {
  auto steady = std::make_shared<ScriptedCamera>(), gone = std::make_shared<ScriptedCamera>();
  steady->stop_after = 2;  // lost after the other: until then the other keeps trying past its back-off
  steady->frame_period = 100ms;
  gone->stop_after = 1;
  auto cameras = std::make_shared<sdqes::Cameras>(2);
  Said said;
  sdqes::LiveReader steady_reader(capture_of(steady), "steady", 0.001, said.log(), {0.01, 0.01}, cameras, 0);
  sdqes::LiveReader gone_reader(capture_of(gone), "gone", 0.001, said.log(), {0.01, 0.01}, cameras, 1);
  for (auto* reader : {&steady_reader, &gone_reader}) {
    sdqes::LatestFrame::Frame frame;
    while (reader->frames().take(frame, kNeverStopped)) {
    }
    EXPECT_TRUE(reader->frames().lost());
    EXPECT_TRUE(reader->frames().reconnection().back_off_spent);
  }
  EXPECT_GT(gone->open_attempts, 2) << "gave up after its back-off while the other still sent";
  const std::lock_guard<std::mutex> lock(said.mutex);
  EXPECT_NE(std::find(said.lines.begin(), said.lines.end(),
                      "gone: lost after 2 attempts; tried again every 0.01 s while another camera sends"),
            said.lines.end());
  EXPECT_NE(std::find(said.lines.begin(), said.lines.end(), "gone: gave up: every camera of the run is lost"),
            said.lines.end());
}

TEST(LiveReader, ARunThatEndsWhileTheReaderWaitsToReconnectCutsTheWaitShortAndIsNotLost) {
  auto camera = std::make_shared<ScriptedCamera>();
  camera->stop_after = 1;
  sdqes::LatestFrame frames;
  auto capture = capture_of(camera);
  std::thread reader([&] { sdqes::read_live(*capture, "cam", 0.001, frames, [](const std::string&) {}, Clock::now(),
                                            sdqes::reconnect_delays_s()); });
  sdqes::LatestFrame::Frame frame;
  ASSERT_TRUE(frames.take(frame, kNeverStopped));
  std::this_thread::sleep_for(50ms);  // the reader is in its first 0.5-s wait
  const auto closed = Clock::now();
  frames.close();
  reader.join();
  EXPECT_LT(Clock::now() - closed, 200ms);
  EXPECT_FALSE(frames.lost());
  EXPECT_EQ(camera->open_attempts, 0);
}

TEST(LiveReader, AReaderStuckInsideAReadDoesNotHoldTheRunsEndPastItsTimeout) {
  auto camera = std::make_shared<ScriptedCamera>();
  camera->grab_blocks_for = 6s;  // a stalled RTSP stream: FFmpeg waits up to 30 s
  std::chrono::steady_clock::time_point start;
  {
    sdqes::LiveReader reader(capture_of(camera), "cam", 0.01, [](const std::string&) {});
    while (camera->grabs == 0) std::this_thread::sleep_for(1ms);
    start = Clock::now();
  }
  const double waited = seconds_since(start);
  EXPECT_GE(waited, sdqes::kReaderStopTimeoutS - 0.01);
  EXPECT_LT(waited, sdqes::kReaderStopTimeoutS + 1.0);
}

TEST(LiveReader, WhatTheCaptureThrowsReachesTheLoopInsteadOfEndingTheProcess) {
  auto camera = std::make_shared<ScriptedCamera>();
  camera->grab_throws = true;
  sdqes::LiveReader reader(capture_of(camera), "cam", 0.01, [](const std::string&) {});
  sdqes::LatestFrame::Frame frame;
  EXPECT_THROW(reader.frames().take(frame, kNeverStopped), std::runtime_error);
}
