// One step's frames from several sources (sdqes/step_gathering.hpp).
#include "sdqes/step_gathering.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

namespace sdqes {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kStopCheck = std::chrono::milliseconds(50);  // a signal cannot wake a condition variable

}  // namespace

std::vector<bool> gather_step(const std::vector<GatheredSource*>& sources, const Arrivals& arrivals,
                              double patience_s, std::vector<bool>& late, const std::function<bool()>& stopped) {
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
      late[*s] = false;
      if (taken[*s] && !first) first = Clock::now();
      s = waiting.erase(s);
    }
    if (waiting.empty()) break;
    if (first && std::all_of(waiting.begin(), waiting.end(), [&late](size_t s) { return late[s]; })) break;
    if (first && Clock::now() >= *first + patience) {
      for (const size_t s : waiting) late[s] = true;
      break;
    }
    const auto check = Clock::now() + kStopCheck;
    arrivals.wait_after(seen, first ? std::min(check, *first + patience) : check);
  }
  return taken;
}

}  // namespace sdqes
