// Files written on a thread of their own (sdqes/background_saves.hpp).
#include "sdqes/background_saves.hpp"

#include <exception>
#include <utility>

namespace sdqes {

BackgroundSaves::BackgroundSaves(std::function<void(const std::string&)> log)
    : log_(std::move(log)), thread_([this] { make_writes(); }) {}

BackgroundSaves::~BackgroundSaves() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ending_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BackgroundSaves::save(const std::string& key, std::function<void()> write) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    bool replaced = false;
    for (auto& waiting : waiting_) {
      if (waiting.key != key) continue;
      waiting.write = std::move(write);  // its place in line kept: the files' order does not change
      replaced = true;
      break;
    }
    if (!replaced) waiting_.push_back({key, std::move(write)});
  }
  changed_.notify_all();
}

void BackgroundSaves::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return waiting_.empty() && !writing_; });
}

void BackgroundSaves::make_writes() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return !waiting_.empty() || ending_; });
    if (waiting_.empty()) return;  // ending, every write made
    Write next = std::move(waiting_.front());
    waiting_.pop_front();
    writing_ = true;
    lock.unlock();
    try {
      next.write();
    } catch (const std::exception& e) {
      log_(std::string("warning: ") + e.what());
    }
    next.write = nullptr;  // the state it held let go before the next is taken
    lock.lock();
    writing_ = false;
    changed_.notify_all();
  }
}

}  // namespace sdqes
