// sdqes-run --state's files are written on a thread of their own (sdqes/background_saves.hpp): the thread that steps
// hands a write over and goes on, the writes are made in order, and none handed over is lost.
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sdqes/background_saves.hpp"

namespace {

// What the writes wrote, in order, and what the writing thread said.
struct Written {
  std::mutex mutex;
  std::vector<std::string> files;
  std::vector<std::string> said;
  void add(std::vector<std::string>& to, const std::string& what) {
    const std::lock_guard<std::mutex> lock(mutex);
    to.push_back(what);
  }
  std::vector<std::string> of(const std::vector<std::string>& which) {
    const std::lock_guard<std::mutex> lock(mutex);
    return which;
  }
};

// A write that holds the writing thread until `released` is set, as a slow disk does; `begun` is set once it is
// being made.
std::function<void()> held_write(Written& written, const std::string& what, std::shared_future<void> released,
                                 std::shared_ptr<std::promise<void>> begun = std::make_shared<std::promise<void>>()) {
  return [&written, what, released, begun] {
    begun->set_value();
    released.wait();
    written.add(written.files, what);
  };
}

}  // namespace

TEST(BackgroundSaves, TheThreadThatStepsHandsAWriteOverWhileTheDiskIsBusyAndTheWritesAreMadeInOrder) {
  Written written;
  std::promise<void> disk;
  sdqes::BackgroundSaves saves([&](const std::string& line) { written.add(written.said, line); });
  saves.save("kitchen.json", held_write(written, "kitchen 1", disk.get_future().share()));
  saves.save("hall.json", [&] { written.add(written.files, "hall 1"); });  // returns: the disk is still busy
  EXPECT_TRUE(written.of(written.files).empty());
  disk.set_value();
  saves.wait();
  EXPECT_EQ(written.of(written.files), (std::vector<std::string>{"kitchen 1", "hall 1"}));
}

TEST(BackgroundSaves, AWaitingWriteOfTheSameFileIsReplacedByTheNewerStateInItsPlaceInLine) {
  Written written;
  std::promise<void> disk;
  sdqes::BackgroundSaves saves([&](const std::string& line) { written.add(written.said, line); });
  const auto begun = std::make_shared<std::promise<void>>();
  const auto hall_1_begun = begun->get_future();
  saves.save("hall.json", held_write(written, "hall 1", disk.get_future().share(), begun));
  hall_1_begun.wait();  // being written
  saves.save("kitchen.json", [&] { written.add(written.files, "kitchen 2"); });
  saves.save("hall.json", [&] { written.add(written.files, "hall 2"); });
  saves.save("kitchen.json", [&] { written.add(written.files, "kitchen 3"); });
  saves.save("hall.json", [&] { written.add(written.files, "hall 3"); });
  disk.set_value();
  saves.wait();
  // hall 1 was begun, so it is finished; of each file's waiting writes only the newest is made
  EXPECT_EQ(written.of(written.files), (std::vector<std::string>{"hall 1", "kitchen 3", "hall 3"}));
}

TEST(BackgroundSaves, EveryWriteHandedOverIsMadeBeforeTheRunEnds) {
  Written written;
  std::promise<void> disk;
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the run ends while the disk is busy
    disk.set_value();
  });
  {
    sdqes::BackgroundSaves saves([&](const std::string& line) { written.add(written.said, line); });
    saves.save("kitchen.json", held_write(written, "kitchen", disk.get_future().share()));
    saves.save("hall.json", [&] { written.add(written.files, "hall"); });
  }  // ~BackgroundSaves, no wait() before it
  release.join();
  EXPECT_EQ(written.of(written.files), (std::vector<std::string>{"kitchen", "hall"}));
}

TEST(BackgroundSaves, AWriteThatFailsIsSaidAndTheWritesAfterItAreStillMade) {
  Written written;
  sdqes::BackgroundSaves saves([&](const std::string& line) { written.add(written.said, line); });
  saves.save("kitchen.json", [] { throw std::runtime_error("cannot write --state kitchen.json: No space left"); });
  saves.save("hall.json", [&] { written.add(written.files, "hall"); });
  saves.wait();
  EXPECT_EQ(written.of(written.said), (std::vector<std::string>{"warning: cannot write --state kitchen.json: No space left"}));
  EXPECT_EQ(written.of(written.files), (std::vector<std::string>{"hall"}));
}
