// sdqes-run --state FILE: each query's alert state kept across a restart (sdqes/alert_state_file.hpp).
#include "sdqes/alert_state_file.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "sdqes/saved_files.hpp"

namespace sdqes {

namespace {

using nlohmann::json;

const char* const kFormat = "sdqes-run alert states";
constexpr int kVersion = 1;

json policy_json(const AlertPolicy& policy) {
  return {{"threshold", policy.threshold},
          {"exit_threshold", policy.exit_threshold ? json(*policy.exit_threshold) : json(nullptr)},
          {"cooldown_s", policy.cooldown_s},
          {"max_alerts", policy.max_alerts ? json(*policy.max_alerts) : json(nullptr)}};
}

// One entry of the file, checked: what is wrong with it named.
SavedAlert saved_alert(const json& entry, size_t index) {
  const std::string where = "alerts[" + std::to_string(index) + "]";
  if (!entry.is_object() || !entry.contains("query") || !entry["query"].is_string() || !entry.contains("policy") ||
      !entry["policy"].is_object()) {
    throw Error(where + " names no query and policy");
  }
  if (!entry.contains("active") || !entry["active"].is_boolean()) throw Error(where + ": active is not true or false");
  if (!entry.contains("count") || !entry["count"].is_number_integer() || entry["count"].get<int64_t>() < 0 ||
      entry["count"].get<int64_t>() > std::numeric_limits<int>::max()) {
    throw Error(where + ": count is not a whole number of alerts");
  }
  const json& age = entry.contains("age_s") ? entry["age_s"] : json(nullptr);
  if (!age.is_null() && !(age.is_number() && age.get<double>() >= 0)) {
    throw Error(where + ": age_s is neither seconds nor null (no alert yet)");
  }
  return {entry["active"].get<bool>(), entry["count"].get<int>(),
          age.is_null() ? std::numeric_limits<double>::infinity() : age.get<double>()};
}

void check_format(const json& saved) {
  if (!saved.is_object() || saved.value("format", "") != kFormat) throw Error("is not an sdqes-run alert state file");
  if (!saved.contains("version") || saved["version"] != kVersion) {
    throw Error("is version " + saved.value("version", json(nullptr)).dump() + " of the alert state file; this " +
                "sdqes-run reads version " + std::to_string(kVersion));
  }
}

}  // namespace

Resumed resume_point(const json& saved, const std::string& source) {
  check_format(saved);
  const json& saved_source = saved.contains("source") ? saved["source"] : json(nullptr);
  if (!saved_source.is_null() && !saved_source.is_string()) throw Error("source is neither a file's name nor null");
  if (source.empty() || saved_source.is_null() || saved_source.get<std::string>() != source) return {};
  const json& position = saved.contains("position") ? saved["position"] : json(nullptr);
  if (!position.is_number_integer() || position.get<int64_t>() < 0) {
    throw Error("position is not a whole number of samples");
  }
  const json& time = saved.contains("stream_time") ? saved["stream_time"] : json(nullptr);
  if (!time.is_number() || !std::isfinite(time.get<double>()) || time.get<double>() < 0) {
    throw Error("stream_time is not a time in seconds");
  }
  if (position.get<int64_t>() == 0) return {};  // stopped before its first frame: nothing to go on from
  return {position.get<int64_t>(), time.get<double>()};
}

json alert_states_json(const QueryTable& queries, const std::vector<AlertState>& states, double stream_time,
                       const SourcePlace& place) {
  json alerts = json::array();
  for (size_t q = 0; q < states.size(); ++q) {
    const SavedAlert saved = states[q].saved(stream_time);
    alerts.push_back({{"query", queries.texts[q]},
                      {"policy", policy_json(states[q].policy())},
                      {"active", saved.active},
                      {"count", saved.count},
                      {"age_s", std::isfinite(saved.age_s) ? json(saved.age_s) : json(nullptr)}});
  }
  // A live source's place is none: null, null (version 1 files before places were kept have neither key).
  const bool placed = !place.source.empty();
  return {{"format", kFormat},
          {"version", kVersion},
          {"stream_time", stream_time},
          {"source", placed ? json(place.source) : json(nullptr)},
          {"position", placed ? json(place.position) : json(nullptr)},
          {"alerts", alerts}};
}

size_t restore_alert_states(const json& saved, const QueryTable& queries, std::vector<AlertState>& states,
                            double stream_time) {
  check_format(saved);
  if (!saved.contains("alerts") || !saved["alerts"].is_array()) throw Error("holds no list of alerts");
  std::map<std::pair<std::string, std::string>, SavedAlert> exact;  // (text, policy) -> its state
  std::map<std::string, std::vector<SavedAlert>> by_text;
  for (size_t i = 0; i < saved["alerts"].size(); ++i) {
    const json& entry = saved["alerts"][i];
    const SavedAlert alert = saved_alert(entry, i);
    exact[{entry["query"].get<std::string>(), entry["policy"].dump()}] = alert;
    by_text[entry["query"].get<std::string>()].push_back(alert);
  }
  size_t restored = 0;
  for (size_t q = 0; q < states.size(); ++q) {
    const auto it = exact.find({queries.texts[q], policy_json(states[q].policy()).dump()});
    const auto same_text = by_text.find(queries.texts[q]);
    if (it != exact.end()) {
      states[q].restore(it->second, stream_time);
    } else if (same_text != by_text.end() && same_text->second.size() == 1) {  // its policy retuned between runs
      states[q].restore(same_text->second.front(), stream_time);
    } else {
      continue;
    }
    ++restored;
  }
  return restored;
}

AlertStateFile::AlertStateFile(std::filesystem::path path) : path_(std::move(path)) {
  check_output_path(path_, "--state", "state.json");
}

Resumed AlertStateFile::restore(const QueryTable& queries, std::vector<AlertState>& states, const std::string& source,
                                const std::function<void(const std::string&)>& log) const {
  std::ifstream in(path_);
  if (!in) {
    log("note: no alert state at " + path_.string() + " yet: each query starts fresh, and its alert state is "
        "written there after an alert and when the stream ends or is stopped");
    return {};
  }
  try {
    const json saved = json::parse(in);
    const Resumed resumed = resume_point(saved, source);
    const size_t restored = restore_alert_states(saved, queries, states, resumed.stream_time);
    log("resumed the alert state of " + std::to_string(restored) + " of " + std::to_string(states.size()) +
        (states.size() == 1 ? " query" : " queries") + " from " + path_.string());
    return resumed;
  } catch (const std::exception& e) {  // json's parse_error, or restore_alert_states' Error
    const std::string problem = dynamic_cast<const json::exception*>(&e) ? "is not valid JSON" : e.what();
    for (auto& state : states) state.reset();  // nothing half-restored
    set_aside_unusable(path_, "--state", problem, "each query starts fresh", log);
    return {};
  }
}

std::string AlertStateFile::contents(const QueryTable& queries, const std::vector<AlertState>& states,
                                     double stream_time, const SourcePlace& place) {
  return alert_states_json(queries, states, stream_time, place).dump(1) + "\n";
}

void AlertStateFile::write(const std::string& contents) const {
  try {
    write_atomically(path_, contents);
  } catch (const Error& e) {
    throw Error("cannot write --state " + path_.string() + ": " + e.what() + " (the file there, if any, is unchanged)");
  }
}

void AlertStateFile::save(const QueryTable& queries, const std::vector<AlertState>& states, double stream_time,
                          const SourcePlace& place) const {
  write(contents(queries, states, stream_time, place));
}

}  // namespace sdqes
