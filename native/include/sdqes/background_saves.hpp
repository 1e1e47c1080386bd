// Files written on a thread of their own, so that the thread that steps does not wait on the disk.
//
// sdqes-run --state writes a stream's alert states and the model's memory of it after an alert: a ViT-B/16 stream's
// memory is 9 MiB, synced to the disk, 15 ms here and more on a Jetson's eMMC or SD card, and 32 streams' alerts
// coming together wrote 32 of them in a row. Meanwhile no stream stepped, and live cameras' frames were dropped. The
// stepping thread now takes what is to be written (a copy, at once) and hands the write over, as the Python runtime's
// save_state(path, wait=False) does.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace sdqes {

class BackgroundSaves {
 public:
  // `log` hears, from the writing thread, a write that failed: "warning: <what it threw>".
  explicit BackgroundSaves(std::function<void(const std::string&)> log);
  // Every write handed over made, then the thread ended: nothing begun is lost at the end of a run.
  ~BackgroundSaves();
  BackgroundSaves(const BackgroundSaves&) = delete;
  BackgroundSaves& operator=(const BackgroundSaves&) = delete;

  // `write` made on the thread after the writes handed over before it; returns at once. A write of the same `key`
  // (a file) still waiting, not begun, is replaced by this one, which holds the newer state: the file ends the same,
  // and a disk slower than the alerts holds one copy of each stream's state waiting, never a growing queue.
  void save(const std::string& key, std::function<void()> write);
  // Returns once every write handed over has been made (a run's last state, written before it says it is done).
  void wait();

 private:
  struct Write {
    std::string key;
    std::function<void()> write;
  };
  void make_writes();

  std::function<void(const std::string&)> log_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Write> waiting_;
  bool writing_ = false;  // a write taken from waiting_ is being made
  bool ending_ = false;
  std::thread thread_;  // last: started once the rest is in place
};

}  // namespace sdqes
