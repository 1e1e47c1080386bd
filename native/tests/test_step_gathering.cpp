// sdqes-run gathers each step's frames from several sources (sdqes/step_gathering.hpp), as runtime/frame_gathering.py
// does: a file's frame is waited for, a live source's for one patience after the step's first frame, and a live
// source that missed that wait is not waited for again until it sends.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sdqes/step_gathering.hpp"

namespace {

using namespace std::chrono_literals;

const auto kNeverStopped = [] { return false; };
constexpr double kLongPatienceS = 30.0;  // longer than any test here runs: a wait that ends did not time out

// A source whose frames the test hands over (`send`), telling `arrivals` as a reader does.
class ScriptedSource : public sdqes::GatheredSource {
 public:
  ScriptedSource(bool live, std::shared_ptr<sdqes::Arrivals> arrivals, std::string name)
      : live_(live), arrivals_(std::move(arrivals)), name_(std::move(name)) {}

  void send(int frames = 1) {
    available_ += frames;
    arrivals_->notify();
  }
  void finish() {
    finished_ = true;
    arrivals_->notify();
  }
  int taken() const { return taken_; }

  const std::string& name() const override { return name_; }
  bool live() const override { return live_; }
  bool ended() const override { return ended_; }
  bool ready() const override { return available_ > 0 || finished_; }
  bool next(const std::function<bool()>& stopped) override {
    while (available_ == 0 && !finished_) {  // a file's frame is waited for: the gathering asks a live one only ready
      if (stopped()) return false;
      std::this_thread::sleep_for(1ms);
    }
    if (available_ == 0) {
      ended_ = true;
      return false;
    }
    --available_;
    ++taken_;
    return true;
  }

 private:
  bool live_;
  std::shared_ptr<sdqes::Arrivals> arrivals_;
  std::string name_;
  std::atomic<int> available_{0};
  std::atomic<bool> finished_{false};
  bool ended_ = false;
  int taken_ = 0;
};

// `source` sends a frame `delay` from now, from a thread of its own (joined by the caller).
std::thread sends_later(ScriptedSource& source, std::chrono::milliseconds delay) {
  return std::thread([&source, delay] {
    std::this_thread::sleep_for(delay);
    source.send();
  });
}

// Sources (added before the first step) gathered step after step, what the gathering said kept.
struct Gathering {
  std::shared_ptr<sdqes::Arrivals> arrivals = std::make_shared<sdqes::Arrivals>();
  std::vector<std::unique_ptr<ScriptedSource>> owned;
  std::vector<sdqes::GatheredSource*> sources;
  sdqes::LateSources late{0};
  double notice_after_s = sdqes::kStallNoticeS;
  std::vector<std::string> said;

  ScriptedSource& add(bool live, const std::string& name = "camera") {
    owned.push_back(std::make_unique<ScriptedSource>(live, arrivals, name));
    sources.push_back(owned.back().get());
    late = sdqes::LateSources(sources.size(), notice_after_s);
    return *owned.back();
  }
  std::vector<bool> step(double patience_s, const std::function<bool()>& stopped = kNeverStopped) {
    return sdqes::gather_step(sources, *arrivals, patience_s, late, stopped,
                              [this](const std::string& line) { said.push_back(line); });
  }
  std::vector<bool> lateness() const {
    std::vector<bool> each;
    for (size_t s = 0; s < sources.size(); ++s) each.push_back(late.late(s));
    return each;
  }
};

TEST(StepGathering, CamerasThatKeepPaceStepTogether) {
  Gathering run;
  auto& a = run.add(true);
  auto& b = run.add(true);
  a.send();
  std::thread later = sends_later(b, 20ms);  // out of phase, well within the patience
  EXPECT_EQ(run.step(kLongPatienceS), (std::vector<bool>{true, true}));
  later.join();
  EXPECT_EQ(run.lateness(), (std::vector<bool>{false, false}));
}

TEST(StepGathering, ACameraThatStallsIdlesItsStreamAndIsNotWaitedForUntilItSendsAgain) {
  Gathering run;
  auto& a = run.add(true);
  auto& b = run.add(true);
  a.send();
  EXPECT_EQ(run.step(0.02), (std::vector<bool>{true, false}));  // b missed the wait: its stream idles
  EXPECT_EQ(run.lateness(), (std::vector<bool>{false, true}));
  a.send();  // no wait for b now: a patience longer than the test does not hold this step
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_EQ(run.step(kLongPatienceS), (std::vector<bool>{true, false}));
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 10s);  // (it returns at once; waiting, it took 30 s)
  b.send();  // b is back: it steps, and is waited for again
  std::thread later = sends_later(a, 20ms);
  EXPECT_EQ(run.step(kLongPatienceS), (std::vector<bool>{true, true}));
  later.join();
  EXPECT_EQ(run.lateness(), (std::vector<bool>{false, false}));
  EXPECT_EQ(a.taken(), 3);
  EXPECT_EQ(b.taken(), 1);
  EXPECT_TRUE(run.said.empty());  // late for a moment, not long enough to be named
}

TEST(StepGathering, ACameraLateForLongIsNamedOnceAndAgainWhenItSends) {
  Gathering run;
  run.notice_after_s = 0.2;
  auto& kitchen = run.add(true, "kitchen");
  auto& garage = run.add(true, "garage");
  for (int k = 0; k < 6; ++k) {  // garage silent for 6 steps of about 0.05 s: past 0.2 s, said once
    kitchen.send();
    EXPECT_EQ(run.step(0.05), (std::vector<bool>{true, false}));
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(run.said.size(), 1u);
  EXPECT_EQ(run.said[0].rfind("garage has sent no frame for ", 0), 0u) << run.said[0];
  EXPECT_NE(run.said[0].find(" s: its stream idles, memory kept, while the others step"), std::string::npos);
  kitchen.send();
  garage.send();
  EXPECT_EQ(run.step(0.05), (std::vector<bool>{true, true}));
  ASSERT_EQ(run.said.size(), 2u);
  EXPECT_EQ(run.said[1].rfind("garage is sending frames again after ", 0), 0u) << run.said[1];
  EXPECT_NE(run.said[1].find(" s without; its stream steps again"), std::string::npos);
}

TEST(StepGathering, ALateCameraThatEndsIsNotSaidToBeSendingAgain) {
  Gathering run;
  run.notice_after_s = 0.0;
  auto& kitchen = run.add(true, "kitchen");
  auto& garage = run.add(true, "garage");
  kitchen.send();
  EXPECT_EQ(run.step(0.02), (std::vector<bool>{true, false}));
  ASSERT_EQ(run.said.size(), 1u);  // named at once (a threshold of 0)
  kitchen.send();
  garage.finish();  // lost for good: the reader says so itself
  EXPECT_EQ(run.step(0.02), (std::vector<bool>{true, false}));
  EXPECT_TRUE(garage.ended());
  EXPECT_EQ(run.said.size(), 1u);
  EXPECT_EQ(run.lateness(), (std::vector<bool>{false, false}));
}

TEST(StepGathering, AFilesFrameIsWaitedForHoweverLongItsDecodingTakes) {
  Gathering run;
  auto& file = run.add(false);
  auto& camera = run.add(true);
  camera.send();
  std::thread decoding = sends_later(file, 50ms);
  EXPECT_EQ(run.step(0.001), (std::vector<bool>{true, true}));
  decoding.join();
}

TEST(StepGathering, ASourceThatEndedIsNotAskedAgainAndNoneLeftEndsTheRun) {
  Gathering run;
  auto& a = run.add(true);
  auto& b = run.add(true);
  a.send();
  b.finish();
  EXPECT_EQ(run.step(kLongPatienceS), (std::vector<bool>{true, false}));
  EXPECT_TRUE(b.ended());
  a.finish();
  EXPECT_EQ(run.step(kLongPatienceS), (std::vector<bool>{false, false}));
  EXPECT_TRUE(a.ended());
}

TEST(StepGathering, AStopEndsTheWaitForAFirstFrame) {
  Gathering run;
  run.add(true);
  run.add(true);
  std::atomic<bool> stop{false};
  std::thread signal([&stop] {
    std::this_thread::sleep_for(30ms);
    stop = true;
  });
  EXPECT_EQ(run.step(kLongPatienceS, [&stop] { return stop.load(); }), (std::vector<bool>{false, false}));
  signal.join();
}

TEST(NoticeIfSlow, WhatIsDoneInTimeIsNotSaidAndIsNotWaitedFor) {
  int said = 0;
  const auto started = std::chrono::steady_clock::now();
  { const sdqes::NoticeIfSlow notice(30.0, [&said] { ++said; }); }
  EXPECT_EQ(said, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << "waited out the notice's time";
}

TEST(NoticeIfSlow, WhatTakesLongerIsSaidOnce) {
  std::atomic<int> said{0};
  {
    const sdqes::NoticeIfSlow notice(0.05, [&said] { ++said; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(said.load(), 1);
  }
  EXPECT_EQ(said.load(), 1);
}

}  // namespace
