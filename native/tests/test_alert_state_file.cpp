// sdqes-run --state keeps each query's alert state across a restart (sdqes/alert_state_file.hpp), as
// `sdqes-edge run --state` does: --max-alerts, hysteresis and cooldown go on where the stopped run left them.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "sdqes/alert_state_file.hpp"
#include "sdqes/saved_files.hpp"

namespace fs = std::filesystem;

namespace {

sdqes::AlertPolicy policy(double threshold, double cooldown_s = 0.0, std::optional<int> max_alerts = std::nullopt) {
  sdqes::AlertPolicy p;
  p.threshold = threshold;
  p.cooldown_s = cooldown_s;
  p.max_alerts = max_alerts;
  return p;
}

sdqes::QueryTable queries_of(const std::vector<std::string>& texts) {
  sdqes::QueryTable table;
  table.texts = texts;
  return table;
}

// A folder of its own for each test, removed after it.
struct Folder {
  fs::path path = fs::temp_directory_path() /
                  ("sdqes-state-" + std::to_string(::getpid()) + "-" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Folder() { fs::create_directories(path); }
  ~Folder() { fs::remove_all(path); }
  std::vector<std::string> names() const {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(path)) found.push_back(entry.path().filename().string());
    return found;
  }
};

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST(AlertStateFile, ARestartedRunKeepsEachQuerysCountHysteresisAndCooldown) {
  const auto queries = queries_of({"Tell me when the kettle boils."});
  std::vector<sdqes::AlertState> before{sdqes::AlertState(policy(0.5, 10.0, 2))};
  ASSERT_TRUE(before[0].update(0.9, 95.0));  // the event starts at 95 s; the run stops at 100 s, still inside it
  const auto saved = sdqes::alert_states_json(queries, before, 100.0);
  std::vector<sdqes::AlertState> after{sdqes::AlertState(policy(0.5, 10.0, 2))};
  ASSERT_EQ(sdqes::restore_alert_states(saved, queries, after), 1u);
  EXPECT_FALSE(after[0].update(0.9, 1.0));  // the same event, still going on: not alerted again
  EXPECT_FALSE(after[0].update(0.1, 2.0));
  EXPECT_FALSE(after[0].update(0.9, 4.0));  // a new event 9 s after the last alert: inside the 10-s cooldown
  EXPECT_FALSE(after[0].update(0.1, 5.0));
  EXPECT_TRUE(after[0].update(0.9, 6.0));  // 11 s after it: alerted, the second of two
  EXPECT_FALSE(after[0].update(0.1, 30.0));
  EXPECT_FALSE(after[0].update(0.9, 31.0));  // --max-alerts 2 reached, counting the stopped run's alert
}

TEST(AlertStateFile, AQueryRetunedBetweenRunsKeepsItsStateByItsTextUnlessTheTextHadSeveral) {
  const auto one = queries_of({"kettle"});
  std::vector<sdqes::AlertState> before{sdqes::AlertState(policy(0.5, 0.0, 1))};
  ASSERT_TRUE(before[0].update(0.9, 1.0));
  std::vector<sdqes::AlertState> retuned{sdqes::AlertState(policy(0.7, 0.0, 1))};
  EXPECT_EQ(sdqes::restore_alert_states(sdqes::alert_states_json(one, before, 2.0), one, retuned), 1u);
  EXPECT_EQ(retuned[0].saved(0.0).count, 1);
  // Asked twice under two policies, then once under a third: which of the two is meant cannot be told.
  const auto twice = queries_of({"kettle", "kettle"});
  std::vector<sdqes::AlertState> two{sdqes::AlertState(policy(0.5)), sdqes::AlertState(policy(0.6))};
  std::vector<sdqes::AlertState> third{sdqes::AlertState(policy(0.7))};
  EXPECT_EQ(sdqes::restore_alert_states(sdqes::alert_states_json(twice, two, 2.0), one, third), 0u);
}

TEST(AlertStateFile, IsWrittenWholeAndReadBackWithNothingElseLeftInItsFolder) {
  Folder folder;
  const sdqes::AlertStateFile file(folder.path / "state.json");
  const auto queries = queries_of({"kettle", "fridge"});
  std::vector<sdqes::AlertState> before{sdqes::AlertState(policy(0.5)), sdqes::AlertState(policy(0.5))};
  ASSERT_TRUE(before[1].update(0.9, 3.0));
  file.save(queries, before, 4.0);
  file.save(queries, before, 5.0);  // replaced, not appended to
  EXPECT_EQ(folder.names(), std::vector<std::string>{"state.json"});
  std::vector<sdqes::AlertState> after{sdqes::AlertState(policy(0.5)), sdqes::AlertState(policy(0.5))};
  std::vector<std::string> said;
  file.restore(queries, after, "", [&](const std::string& line) { said.push_back(line); });
  EXPECT_EQ(said, std::vector<std::string>{"resumed the alert state of 2 of 2 queries from " +
                                           (folder.path / "state.json").string()});
  EXPECT_EQ(after[1].saved(0.0).count, 1);
  EXPECT_DOUBLE_EQ(after[1].saved(0.0).age_s, 2.0);
  EXPECT_EQ(after[0].saved(0.0).count, 0);
}

TEST(AlertStateFile, AVideoGoesOnWhereTheStoppedRunLeftItOnlyWhereItIsTheSameFileNotRewritten) {
  Folder folder;
  const sdqes::AlertStateFile file(folder.path / "state.json");
  const auto queries = queries_of({"kettle"});
  const std::string video = "/videos/kitchen.avi (1000 bytes)";
  std::vector<sdqes::AlertState> before{sdqes::AlertState(policy(0.5, 10.0))};
  ASSERT_TRUE(before[0].update(0.9, 20.0));
  ASSERT_FALSE(before[0].update(0.1, 24.0));
  file.save(queries, before, 24.0, {video, 121});  // stopped after the frame at 24 s: sample 121 is next
  const auto restore = [&](const std::string& source, std::vector<std::string>& said) {
    std::vector<sdqes::AlertState> after{sdqes::AlertState(policy(0.5, 10.0))};
    const auto resumed = file.restore(queries, after, source, [&](const std::string& line) { said.push_back(line); });
    return std::make_pair(resumed, after);
  };
  std::vector<std::string> said;
  auto [resumed, after] = restore(video, said);
  EXPECT_EQ(resumed.position, 121);
  EXPECT_DOUBLE_EQ(resumed.stream_time, 24.0);
  EXPECT_FALSE(after[0].update(0.9, 29.0));  // stream times go on: 9 s after the alert, inside its cooldown
  EXPECT_FALSE(after[0].update(0.1, 29.5));
  EXPECT_TRUE(after[0].update(0.9, 30.5));
  for (const std::string& other : {std::string("/videos/kitchen.avi (2000 bytes)"), std::string("")}) {
    auto [from_start, fresh_times] = restore(other, said);  // rewritten since, or a camera: from its start, at 0 s
    EXPECT_EQ(from_start.position, 0) << other;
    EXPECT_DOUBLE_EQ(from_start.stream_time, 0.0);
    EXPECT_DOUBLE_EQ(fresh_times[0].saved(0.0).age_s, 4.0);  // the alert 4 s before the restart, all the same
  }
  EXPECT_EQ(said.size(), 3u);  // each said it resumed the alert states, nothing set aside
  // A live source has no place; a file of an sdqes-run before places were kept has none either.
  EXPECT_TRUE(sdqes::alert_states_json(queries, before, 24.0)["source"].is_null());
  auto older = sdqes::alert_states_json(queries, before, 24.0, {video, 121});
  older.erase("source");
  older.erase("position");
  EXPECT_EQ(sdqes::resume_point(older, video).position, 0);
  auto damaged = sdqes::alert_states_json(queries, before, 24.0, {video, 121});
  damaged["position"] = -3;
  write(folder.path / "state.json", damaged.dump());
  said.clear();
  EXPECT_EQ(restore(video, said).first.position, 0);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("position is not a whole number of samples: each query starts fresh"), std::string::npos)
      << said[0];
}

TEST(AlertStateFile, AFileThatCannotBeUsedIsSetAsideAndEachQueryStartsFresh) {
  Folder folder;
  const sdqes::AlertStateFile file(folder.path / "state.json");
  const auto queries = queries_of({"kettle"});
  for (const auto& [text, problem] : std::vector<std::pair<std::string, std::string>>{
           {"{\"format\": \"sdqes-run alert st", "is not valid JSON"},
           {"{\"format\": \"something else\"}", "is not an sdqes-run alert state file"},
           {"{\"format\": \"sdqes-run alert states\", \"version\": 1, \"alerts\": [{\"query\": \"kettle\", "
            "\"policy\": {}, \"active\": false, \"count\": -1, \"age_s\": null}]}",
            "alerts[0]: count is not a whole number of alerts"}}) {
    write(folder.path / "state.json", text);
    std::vector<sdqes::AlertState> states{sdqes::AlertState(policy(0.5))};
    std::vector<std::string> said;
    file.restore(queries, states, "", [&](const std::string& line) { said.push_back(line); });
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("warning: --state " + (folder.path / "state.json").string() + " " + problem +
                           ": each query starts fresh; that file is kept as "),
              std::string::npos)
        << said[0];
    EXPECT_FALSE(fs::exists(folder.path / "state.json"));
    EXPECT_EQ(states[0].saved(0.0).count, 0);
  }
  EXPECT_EQ(folder.names().size(), 3u);  // each kept under a name of its own: the user's, never deleted
}

TEST(AlertStateFile, APathThatCannotBeWrittenIsRefusedUpFrontAndAFailedWriteSaysWhichFile) {
  Folder folder;
  EXPECT_THROW(sdqes::AlertStateFile(folder.path / "missing" / "state.json"), sdqes::Error);
  EXPECT_THROW(sdqes::AlertStateFile{folder.path}, sdqes::Error);  // a folder, not a file
  fs::create_directories(folder.path / "sub");
  const sdqes::AlertStateFile file(folder.path / "sub" / "state.json");
  const auto queries = queries_of({"kettle"});
  const std::vector<sdqes::AlertState> states{sdqes::AlertState(policy(0.5))};
  file.save(queries, states, 1.0);
  fs::remove_all(folder.path / "sub");  // its folder gone while the run streams (an unmounted card)
  try {
    file.save(queries, states, 2.0);
    FAIL() << "a write into a folder that is gone was taken";
  } catch (const sdqes::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write --state " + (folder.path / "sub" / "state.json").string()),
              std::string::npos)
        << e.what();
  }
}

TEST(CheckOutputPath, RefusesAFolderOrAMissingFolderAndTakesAnExistingAppendedFileAsItIs) {
  Folder folder;
  try {
    sdqes::check_output_path(folder.path, "--events", "alerts.jsonl");
    FAIL() << "a folder was taken as the alert log";
  } catch (const sdqes::Error& e) {
    EXPECT_EQ(std::string(e.what()), "--events " + folder.path.string() + " is a folder; give a file in it (" +
                                         (folder.path / "alerts.jsonl").string() + ")");
  }
  const fs::path missing = folder.path / "missing" / "alerts.jsonl";
  EXPECT_THROW(sdqes::check_output_path(missing, "--events", "alerts.jsonl", /*appended=*/true), sdqes::Error);
  // An existing log is appended to: the file is what must be writable, not its folder (/dev for /dev/stdout).
  EXPECT_NO_THROW(sdqes::check_output_path("/dev/null", "--events", "alerts.jsonl", /*appended=*/true));
  EXPECT_NO_THROW(sdqes::check_output_path(folder.path / "new.jsonl", "--events", "alerts.jsonl", true));
}

TEST(WriteAtomically, ReplacesTheFileALinkLeadsToAndKeepsTheLink) {
  // --state state.json -> elsewhere/state.json (the state on another disk): the rename replaced the link itself, the
  // linked file was left stale, and the next run read the copy beside the link.
  Folder folder;
  fs::create_directories(folder.path / "elsewhere");
  write(folder.path / "elsewhere" / "state.json", "old");
  fs::create_symlink("elsewhere/state.json", folder.path / "state.json");
  sdqes::write_atomically(folder.path / "state.json", std::string("new"));
  EXPECT_TRUE(fs::is_symlink(folder.path / "state.json"));
  std::ifstream linked(folder.path / "elsewhere" / "state.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(linked), {}), "new");
  // A link that leads nowhere yet: the file is made where it points, once that folder exists.
  fs::create_symlink("later/state.json", folder.path / "pending.json");
  EXPECT_THROW(sdqes::check_output_path(folder.path / "pending.json", "--state", "state.json"), sdqes::Error);
  fs::create_directories(folder.path / "later");
  EXPECT_NO_THROW(sdqes::check_output_path(folder.path / "pending.json", "--state", "state.json"));
  sdqes::write_atomically(folder.path / "pending.json", std::string("made"));
  EXPECT_TRUE(fs::is_symlink(folder.path / "pending.json") && fs::is_regular_file(folder.path / "later" / "state.json"));
}

TEST(WriteAtomically, NeverWritesThroughALinkPlantedWhereItsPartialCopyGoes) {
  // The partial copy's name (.NAME.partial-PID) can be guessed: a link planted there in a shared folder had the state
  // written through it to the file it led to.
  Folder folder;
  write(folder.path / "victim.txt", "the user's own file");
  fs::create_symlink(folder.path / "victim.txt",
                     folder.path / (".state.json.partial-" + std::to_string(::getpid())));
  sdqes::write_atomically(folder.path / "state.json", std::string("new"));
  std::ifstream victim(folder.path / "victim.txt"), state(folder.path / "state.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(victim), {}), "the user's own file");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(state), {}), "new");
}

TEST(CheckPathForm, ANameTooLongAndLinksInALoopAreOneLineNamingTheOptionAsThePythonRuntimeSaysThem) {
  Folder folder;
  const fs::path long_name = folder.path / (std::string(300, 'a') + ".json");
  fs::create_symlink("loop-b", folder.path / "loop-a");
  fs::create_symlink("loop-a", folder.path / "loop-b");
  const auto refusal = [](const fs::path& path) -> std::string {
    try {
      sdqes::check_output_path(path, "--state", "state.json");
    } catch (const sdqes::Error& e) {
      return e.what();
    }
    return "taken";
  };
  // std::filesystem threw "filesystem error: status: File name too long [PATH]" after the engine had loaded.
  EXPECT_EQ(refusal(long_name), "--state " + long_name.string() + " has a name longer than its file system holds " +
                                    "(File name too long: most hold 255 bytes a name); give a shorter name");
  // It was told that the folder loop-a "does not exist; make it first (mkdir -p ...)".
  EXPECT_EQ(refusal(folder.path / "loop-a" / "state.json"),
            "--state " + (folder.path / "loop-a" / "state.json").string() + " leads round a loop of symbolic links " +
                "(Too many levels of symbolic links); give a path whose links end at a file or folder");
  EXPECT_NO_THROW(sdqes::check_path_form(folder.path / "not-yet.json", "--state"));  // nothing there yet is no fault
}
