// A live source that stopped sending frames, reopened with back-off: the twin of runtime/live_source.py's LiveSource.
#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>
#include <thread>

#include "sdqes/runtime.hpp"

namespace sdqes {

const std::vector<double>& reconnect_delays_s() {
  static const std::vector<double> delays{0.5, 1.0, 2.0, 4.0, 8.0};  // live_source.RECONNECT_DELAYS_S
  return delays;
}

int reconnect(const std::string& name, const std::function<bool()>& open, const std::function<bool(double)>& wait,
              const std::function<void(const std::string&)>& log, const std::vector<double>& delays,
              const std::function<bool()>& keep_trying, const std::function<void()>& spent) {
  const size_t tries = delays.size();
  for (size_t attempt = 1; attempt <= tries || (keep_trying && tries > 0); ++attempt) {
    const double delay = delays[std::min(attempt, tries) - 1];
    if (attempt <= tries) {
      std::ostringstream said;  // the delay as Python's {:g} writes it: 0.5, 1, 2
      said << name << ": no frame; reconnecting in " << delay << " s (attempt " << attempt << " of " << tries << ")";
      log(said.str());
    } else if (!keep_trying()) {
      log(name + ": gave up: every camera of the run is lost");
      return 0;
    }
    if (!wait(delay)) return 0;
    if (open()) {
      log(name + ": reconnected");
      return static_cast<int>(std::min<size_t>(attempt, std::numeric_limits<int>::max()));
    }
    if (attempt == tries && keep_trying) {
      std::ostringstream said;
      said << name << ": lost after " << tries << (tries == 1 ? " attempt" : " attempts") << "; tried again every "
           << delay << " s while another camera sends";
      log(said.str());
      if (spent) spent();
    }
  }
  log(name + ": gave up after " + std::to_string(tries) + (tries == 1 ? " attempt" : " attempts"));
  return 0;
}

bool wait_unless_stopped(double seconds, const StopOnSignal& stop) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(seconds));
  while (!stop.requested()) {
    const Clock::duration left = until - Clock::now();
    if (left <= Clock::duration::zero()) return true;
    std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(50)));
  }
  return false;
}

}  // namespace sdqes
