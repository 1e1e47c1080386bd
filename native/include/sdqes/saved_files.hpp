// Files a run keeps across a restart (sdqes-run --state): written atomically, and one that cannot be used set aside
// rather than deleted (it is the user's).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace sdqes {

// `data` written to `path` atomically: to a partial file beside it, synced to the disk, renamed over it, the folder
// synced. The old file or the new one, whole, even across a power cut. Throws Error(the reason) where it cannot.
void write_atomically(const std::filesystem::path& path, const std::string& data);
// The same, `parts` written one after another as one file (a memory file's header and its state, the state not copied
// again to join them).
void write_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& parts);

// Refuses, in one line (an Error: "<named> PATH has a name longer than its file system holds (...); give a shorter
// name"), a path the system refuses for its form whatever is on disk: a name too long (ENAMETOOLONG), links that lead
// round a loop (ELOOP). std::filesystem's checks throw "filesystem error: status: ..." for the first and answer
// "nothing there" to the second (advice to mkdir what the user can see is a link). Worded as path_checks.py's.
void check_path_form(const std::filesystem::path& path, const std::string& named);

// The first folder on the way to `path` this user may not enter (search permission), or `path`'s folder where every
// one may be: what EACCES from a look at `path` means (path_checks.py's _closed_folder).
std::filesystem::path first_closed_folder(const std::filesystem::path& path);

// Why this user may not read `path` (a folder on the way it may not enter, or `path` itself not granted `access`, as
// access(2) takes it), in words that follow its name: "cannot be read: this user may not enter F (Permission
// denied)"; empty where it may, or where nothing is there (path_checks.py's unreadable_problem).
std::string unreadable_problem(const std::filesystem::path& path, int access_mode);

// Refuses, in one line naming `option` (an Error), an output path a run could not write: a folder (a file in it,
// `example`, suggested), a folder that does not exist, one this user may not write. Checked before any engine is
// looked for, so that the refusal does not come at the first alert, hours in. `appended`: the output is appended to
// where it exists (an alert log, /dev/stdout), so it is that file this user must be able to write, not its folder
// (/dev), which a file replaced atomically (--state) needs.
void check_output_path(const std::filesystem::path& path, const std::string& option, const std::string& example,
                       bool appended = false);

// Takes the lock of a file a run writes (its alert log, its --state) for the rest of the process, as `sdqes-edge run`
// does (runtime/output_locks.py), so that two runs, of either runtime, never write one file between them: an
// flock on `.NAME.lock` beside it, holding "PID sdqes-run", which the kernel lets go when the process ends. Refuses
// (an Error: "<option> PATH is being written by another run (pid N, PROGRAM); ...") where another run holds it, and
// ("<option> PATH is the file <other option> PATH writes too: ...") where this run gave it to another option already;
// goes on unlocked where no lock can be taken (a device such as /dev/stdout, a folder it may not create in, a file
// system without locks).
void hold_output(const std::filesystem::path& output, const std::string& option);

// Whether the open file `fd` is the file at `path` (its links followed): a lock file not replaced since it was
// opened, stdout given as --events.
bool same_file(int fd, const std::filesystem::path& path);

// Records a file the run reads (a video given to --source), which hold_output then refuses as an output ("<option>
// PATH is the file --source PATH reads: ..."): an alert log appended to the user's video, a snapshot written over it.
void reads_source(const std::filesystem::path& source);

// Records the bundle folder the run reads, inside which hold_output then refuses every output ("<option> PATH is
// inside the bundle BUNDLE, which is read, never written ..."): --events bundle/queries.json had appended alerts to it.
void reads_bundle(const std::filesystem::path& bundle);

// A file of the user's that a run cannot use (`problem`: "is not valid JSON") renamed beside itself as
// NAME.unusable-<UTC stamp>EXT (state.unusable-20261128T031502Z.json), said through `log`:
// "warning: <named> PATH <problem>: <fresh>; that file is kept as KEPT". An Error in the same words where it cannot
// be moved. named: "--state", "--state memory"; fresh: "each query starts fresh".
void set_aside_unusable(const std::filesystem::path& path, const std::string& named, const std::string& problem,
                        const std::string& fresh, const std::function<void(const std::string&)>& log);

}  // namespace sdqes
