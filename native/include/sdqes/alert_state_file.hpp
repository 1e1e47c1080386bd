// sdqes-run --state FILE: each query's alert state kept across a restart, as `sdqes-edge run --state` keeps it.
//
// A service restarted by systemd (a camera lost and found, a reboot, a crash) began every query afresh: a reminder
// to be given once (--max-alerts 1) was given again, and an event still going on was alerted a second time. The file
// is JSON, written atomically (the old file or the new one, whole, even across a power cut) after an alert (at most
// every kAlertStateEveryS seconds) and when the stream ends or is stopped, and read at the next start. The model's
// memory of the stream is kept beside it, in a file of its own (sdqes/memory_file.hpp).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sdqes/runtime.hpp"

namespace sdqes {

inline constexpr double kAlertStateEveryS = 5.0;  // the Python runtime's ALERT_SNAPSHOT_SECONDS

// Each query's state as JSON, by its text and policy (a text asked under two policies keeps two states).
nlohmann::json alert_states_json(const QueryTable& queries, const std::vector<AlertState>& states,
                                 double stream_time);
// Restores from `saved` (alert_states_json's) the state of each query, found by its text and policy, else by its
// text alone when the file holds one state for it (its threshold retuned between runs), as runtime/snapshots.py
// does; the run's stream time is 0. -> the queries restored. Throws Error naming what is wrong with `saved`.
size_t restore_alert_states(const nlohmann::json& saved, const QueryTable& queries, std::vector<AlertState>& states);

class AlertStateFile {
 public:
  // Checks up front that `path` can be written (its folder is there and writable; not a folder itself): an Error
  // saying what to give otherwise.
  explicit AlertStateFile(std::filesystem::path path);
  // The states saved there, where the file exists; one that cannot be used (damaged, not ours) is renamed beside it
  // ("state.unusable-20261128T031502Z.json"), said through `log`, and the stream starts fresh.
  void restore(const QueryTable& queries, std::vector<AlertState>& states,
               const std::function<void(const std::string&)>& log) const;
  // Written atomically: synced to the disk, then renamed over the old file. Throws Error naming the file.
  void save(const QueryTable& queries, const std::vector<AlertState>& states, double stream_time) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path folder_;  // where it is written, renamed and set aside ("." for a bare file name)
};

}  // namespace sdqes
