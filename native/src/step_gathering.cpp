// One step's frames from several sources (sdqes/step_gathering.hpp).
#include "sdqes/step_gathering.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

namespace sdqes {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kStopCheck = std::chrono::milliseconds(50);  // a signal cannot wake a condition variable

// "0.3 s", "12 s": as runtime/frame_gathering.py's _seconds.
std::string seconds_words(Clock::duration elapsed) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  char words[32];
  std::snprintf(words, sizeof words, seconds < 10 ? "%.1f s" : "%.0f s", seconds);
  return words;
}

// `source` sent a frame (or ended: `sent_frame` false): no longer late, and back in words where its stall was said
// (an end is said by the source itself: a camera lost for good).
void heard_from(LateSources& late, size_t source, bool sent_frame, const std::string& name,
                const std::function<void(const std::string&)>& say) {
  if (late.said[source] && sent_frame) {
    say(name + " is sending frames again after " + seconds_words(Clock::now() - *late.since[source]) +
        " without; its stream steps again");
  }
  late.since[source].reset();
  late.said[source] = false;
}

// Names each source late for `late.notice_after_s` and not yet named.
void say_stalls(LateSources& late, const std::vector<GatheredSource*>& sources,
                const std::function<void(const std::string&)>& say) {
  const auto now = Clock::now();
  for (size_t s = 0; s < sources.size(); ++s) {
    if (!late.since[s] || late.said[s] || sources[s]->ended() ||
        std::chrono::duration<double>(now - *late.since[s]).count() < late.notice_after_s) {
      continue;
    }
    late.said[s] = true;
    say(sources[s]->name() + " has sent no frame for " + seconds_words(now - *late.since[s]) +
        ": its stream idles, memory kept, while the others step");
  }
}

}  // namespace

std::vector<bool> gather_step(const std::vector<GatheredSource*>& sources, const Arrivals& arrivals,
                              double patience_s, LateSources& late, const std::function<bool()>& stopped,
                              const std::function<void(const std::string&)>& say) {
  std::vector<bool> taken(sources.size(), false);
  std::optional<Clock::time_point> first;  // when the step's first frame came
  std::vector<size_t> waiting;             // the live sources not yet heard from this step
  for (size_t s = 0; s < sources.size(); ++s) {
    if (sources[s]->ended()) continue;
    if (sources[s]->live()) {
      waiting.push_back(s);
      continue;
    }
    taken[s] = sources[s]->next(stopped);  // a file's frame is never late, only slower or faster to decode
    if (taken[s] && !first) first = Clock::now();
  }
  const auto patience = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(patience_s));
  while (!waiting.empty() && !stopped()) {
    const uint64_t seen = arrivals.count();  // read before looking: a frame handed over after the look wakes the wait
    for (auto s = waiting.begin(); s != waiting.end();) {
      if (!sources[*s]->ready()) {
        ++s;
        continue;
      }
      taken[*s] = sources[*s]->next(stopped);
      heard_from(late, *s, taken[*s], sources[*s]->name(), say);
      if (taken[*s] && !first) first = Clock::now();
      s = waiting.erase(s);
    }
    if (waiting.empty()) break;
    if (first && std::all_of(waiting.begin(), waiting.end(), [&late](size_t s) { return late.late(s); })) break;
    if (first && Clock::now() >= *first + patience) {
      for (const size_t s : waiting) {
        if (!late.since[s]) late.since[s] = *first;
      }
      break;
    }
    const auto check = Clock::now() + kStopCheck;
    arrivals.wait_after(seen, first ? std::min(check, *first + patience) : check);
  }
  say_stalls(late, sources, say);
  return taken;
}

NoticeIfSlow::NoticeIfSlow(double after_s, std::function<void()> say)
    : watcher_([this, after_s, say = std::move(say)] {
        std::unique_lock lock(mutex_);
        if (!finished_.wait_for(lock, std::chrono::duration<double>(after_s), [this] { return done_; })) say();
      }) {}

NoticeIfSlow::~NoticeIfSlow() {
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
  }
  finished_.notify_all();
  watcher_.join();
}

}  // namespace sdqes
