// sdqes-run --state FILE: each query's alert state kept across a restart, as `sdqes-edge run --state` keeps it.
//
// A service restarted by systemd (a camera lost and found, a reboot, a crash) began every query afresh: a reminder
// to be given once (--max-alerts 1) was given again, and an event still going on was alerted a second time. The file
// is JSON, written atomically (the old file or the new one, whole, even across a power cut) after an alert (at most
// every kAlertStateEveryS seconds) and when the stream ends or is stopped, and read at the next start. The model's
// memory of the stream is kept beside it, in a file of its own (sdqes/memory_file.hpp). A video file goes on where
// the stopped run left it, as `sdqes-edge run --state` resumes one: stepped again from its start, its first part was
// seen twice and alerted twice.
#pragma once

#include <filesystem>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sdqes/runtime.hpp"

namespace sdqes {

inline constexpr double kAlertStateEveryS = 5.0;  // the Python runtime's ALERT_SNAPSHOT_SECONDS

// Where a stream's source had got to: a video file's identity (its path and size, as `sdqes-edge run`'s snapshot
// names it; empty for a live source, which has no place to go back to) and the sample index it goes on at.
struct SourcePlace {
  std::string source;
  int64_t position = 0;
};

// What a restarted stream goes on from: the sample its source goes on at (0: its beginning) and the stream time of
// the stopped run's last step, which its alert states are restored at (0 where the source starts again).
struct Resumed {
  int64_t position = 0;
  double stream_time = 0.0;
};

// Each query's state as JSON, by its text and policy (a text asked under two policies keeps two states), and the
// source's place.
nlohmann::json alert_states_json(const QueryTable& queries, const std::vector<AlertState>& states,
                                 double stream_time, const SourcePlace& place = {});
// Restores from `saved` (alert_states_json's) the state of each query, found by its text and policy, else by its
// text alone when the file holds one state for it (its threshold retuned between runs), as runtime/snapshots.py
// does, at `stream_time` of the run that goes on. -> the queries restored. Throws Error naming what is wrong.
size_t restore_alert_states(const nlohmann::json& saved, const QueryTable& queries, std::vector<AlertState>& states,
                            double stream_time = 0.0);
// Where the run that saved `saved` leaves `source` (a SourcePlace's identity): its place there where it was reading
// that very file; else from the beginning, at stream time 0 (another file, a camera, a file of an older sdqes-run
// that kept no place). Throws Error naming what is wrong with `saved`.
Resumed resume_point(const nlohmann::json& saved, const std::string& source);

class AlertStateFile {
 public:
  // Checks up front that `path` can be written (its folder is there and writable; not a folder itself): an Error
  // saying what to give otherwise.
  explicit AlertStateFile(std::filesystem::path path);
  // The states saved there, where the file exists, and where `source` (SourcePlace's identity; empty: live) goes
  // on (resume_point). One that cannot be used (damaged, not ours) is renamed beside it
  // ("state.unusable-20261128T031502Z.json"), said through `log`, and the stream starts fresh.
  Resumed restore(const QueryTable& queries, std::vector<AlertState>& states, const std::string& source,
                  const std::function<void(const std::string&)>& log) const;
  // Written atomically: synced to the disk, then renamed over the old file. Throws Error naming the file.
  void save(const QueryTable& queries, const std::vector<AlertState>& states, double stream_time,
            const SourcePlace& place = {}) const;
  // save in two: the file's contents taken now, written later (on a thread of its own; sdqes/background_saves.hpp).
  static std::string contents(const QueryTable& queries, const std::vector<AlertState>& states, double stream_time,
                              const SourcePlace& place = {});
  void write(const std::string& contents) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace sdqes
