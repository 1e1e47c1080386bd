// sdqes-run reads a video file on a thread of its own, a frame ahead of the loop (sdqes/file_reader.hpp), on a
// scripted video: every sample time is served, by the first frame at or after it, as runtime/sampling.py serves it;
// none is dropped however slow the loop; the next frame is decoded and prepared while the loop steps this one; a run
// resumed from --state goes on at its sample; the end, a frame that will not decode and an error reach the loop.
#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "sdqes/file_reader.hpp"

namespace {

using namespace std::chrono_literals;

const auto kNeverStopped = [] { return false; };

// A video of `frames` frames, `frame_period` seconds apart; each decoded frame's one pixel is its number (from 0).
struct ScriptedVideo {
  int frames = 0;
  double frame_period = 0.1;
  int undecodable = -1;  // this frame will not decode
  bool grab_throws = false;
  std::atomic<int> grabbed{0};   // frames read (the next one's number)
  std::atomic<int> decoded{0};
  std::atomic<int> prepared{0};
};

std::shared_ptr<sdqes::FileCapture> capture_of(const std::shared_ptr<ScriptedVideo>& video, bool prepare = true) {
  auto capture = std::make_shared<sdqes::FileCapture>();
  capture->grab = [video] {
    if (video->grab_throws) throw std::runtime_error("VIDEOIO(FFMPEG): read error");
    if (video->grabbed >= video->frames) return false;
    ++video->grabbed;
    return true;
  };
  capture->stamp_s = [video] { return (video->grabbed - 1) * video->frame_period; };
  capture->retrieve = [video](cv::Mat& image) {
    ++video->decoded;
    if (video->grabbed - 1 == video->undecodable) return false;
    image = cv::Mat(1, 1, CV_32S, cv::Scalar(video->grabbed - 1));
    return true;
  };
  if (prepare) {
    capture->prepare = [video](const cv::Mat& image) {
      ++video->prepared;
      return std::vector<float>{static_cast<float>(image.at<int>(0))};
    };
  }
  return capture;
}

// (frame number, sample times it serves) of every frame handed over, to the end.
std::vector<std::pair<int, int64_t>> everything(sdqes::FileReader& reader) {
  std::vector<std::pair<int, int64_t>> handed;
  sdqes::LatestFrame::Frame frame;
  while (reader.frames().take(frame, kNeverStopped)) {
    handed.emplace_back(static_cast<int>(frame.prepared.at(0)), frame.serves);
  }
  return handed;
}

}  // namespace

TEST(FileReader, ServesEverySampleTimeByTheFirstFrameAtOrAfterItAsTheSamplerDoes) {
  auto fast = std::make_shared<ScriptedVideo>();  // 10 frames a second, sampled at 5: every other frame, none twice
  fast->frames = 7;
  sdqes::FileReader every_other(capture_of(fast), 0.2, 0);
  EXPECT_EQ(everything(every_other), (std::vector<std::pair<int, int64_t>>{{0, 1}, {2, 1}, {4, 1}, {6, 1}}));
  EXPECT_EQ(fast->decoded, 4);  // the frames between sample times are read, not decoded
  auto slow = std::make_shared<ScriptedVideo>();  // 2.5 frames a second sampled at 5: each later frame serves two
  slow->frames = 3;
  slow->frame_period = 0.4;
  sdqes::FileReader twice(capture_of(slow), 0.2, 0);
  EXPECT_EQ(everything(twice), (std::vector<std::pair<int, int64_t>>{{0, 1}, {1, 2}, {2, 2}}));
}

TEST(FileReader, AResumedRunGoesOnAtItsSampleTheOnesBeforeReadButNeverDecoded) {
  auto video = std::make_shared<ScriptedVideo>();
  video->frames = 10;
  sdqes::FileReader reader(capture_of(video), 0.2, 3);  // samples 0 to 2 were stepped by the run that stopped
  EXPECT_EQ(everything(reader), (std::vector<std::pair<int, int64_t>>{{6, 1}, {8, 1}}));
  EXPECT_EQ(video->decoded, 2);
  auto slow = std::make_shared<ScriptedVideo>();
  slow->frames = 3;
  slow->frame_period = 0.4;
  sdqes::FileReader half_served(capture_of(slow), 0.2, 2);  // frame 1 serves samples 1 and 2: it goes on at 2
  EXPECT_EQ(everything(half_served), (std::vector<std::pair<int, int64_t>>{{1, 1}, {2, 2}}));
}

TEST(FileReader, TheNextFrameIsPreparedWhileTheLoopStepsAndNoneIsDroppedHoweverSlowTheLoop) {
  auto video = std::make_shared<ScriptedVideo>();
  video->frames = 20;
  sdqes::FileReader reader(capture_of(video), 0.1, 0);
  sdqes::LatestFrame::Frame frame;
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(reader.frames().take(frame, kNeverStopped));
    EXPECT_EQ(frame.prepared.at(0), static_cast<float>(k));
    std::this_thread::sleep_for(30ms);  // the step: meanwhile the next frame is made ready, and only it
    EXPECT_GE(video->prepared, k + 2) << "frame " << k + 1 << " was not prepared while frame " << k << " stepped";
    EXPECT_LE(video->prepared, k + 3) << "the reader ran ahead of the loop";
  }
  EXPECT_EQ(reader.frames().dropped(), 0);
}

TEST(FileReader, WithoutPrepareTheDecodedImageIsHandedOver) {
  auto video = std::make_shared<ScriptedVideo>();
  video->frames = 2;
  sdqes::FileReader reader(capture_of(video, false), 0.1, 0);
  sdqes::LatestFrame::Frame frame;
  ASSERT_TRUE(reader.frames().take(frame, kNeverStopped));
  EXPECT_TRUE(frame.prepared.empty());
  EXPECT_EQ(frame.image.at<int>(0), 0);
}

TEST(FileReader, AFrameThatWillNotDecodeEndsTheStreamAndAnErrorReachesTheLoop) {
  auto video = std::make_shared<ScriptedVideo>();
  video->frames = 10;
  video->undecodable = 4;
  sdqes::FileReader reader(capture_of(video), 0.1, 0);
  EXPECT_EQ(everything(reader).size(), 4u);
  EXPECT_FALSE(reader.frames().lost());
  auto broken = std::make_shared<ScriptedVideo>();
  broken->frames = 10;
  broken->grab_throws = true;
  sdqes::FileReader throwing(capture_of(broken), 0.1, 0);
  sdqes::LatestFrame::Frame frame;
  EXPECT_THROW(throwing.frames().take(frame, kNeverStopped), std::runtime_error);
}

TEST(FileReader, ARunThatEndsEarlyEndsItsReaderAtOnce) {
  auto video = std::make_shared<ScriptedVideo>();
  video->frames = 1000;
  const auto start = std::chrono::steady_clock::now();
  {
    sdqes::FileReader reader(capture_of(video), 0.1, 0);
    sdqes::LatestFrame::Frame frame;
    ASSERT_TRUE(reader.frames().take(frame, kNeverStopped));  // --max-frames 1: the reader waits with the next
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_LT(video->grabbed, 10);
}
