// Files a run keeps across a restart (sdqes/saved_files.hpp).
#include "sdqes/saved_files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdqes/runtime.hpp"

namespace sdqes {

namespace {

// "20261128T031502Z": when a file was set aside (files.py's utc_stamp).
std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

std::filesystem::path folder_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

void sync_folder(const std::filesystem::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // the rename itself reaches the disk
  ::close(fd);
}

// `path` with the symbolic links at its end followed, one that leads nowhere yet too (to where it points): what a
// write to it reaches, as the shell's `>` reaches it (files.py's through_links). A file replaced by a rename replaced
// the link itself: `--state state.json -> /data/state.json` became a file of its own, the linked one left stale.
std::filesystem::path through_links(std::filesystem::path path) {
  std::error_code error;
  for (int hops = 0; hops < 40 && std::filesystem::is_symlink(path, error); ++hops) {  // 40: the kernel's own limit
    const std::filesystem::path target = std::filesystem::read_symlink(path, error);
    if (error) break;
    path = target.is_absolute() ? target : folder_of(path) / target;
  }
  return path;
}

// `path` renamed beside itself as NAME.unusable-<UTC stamp>EXT -> that name; Error(the reason) where it cannot be.
std::filesystem::path set_aside(const std::filesystem::path& path) {
  std::filesystem::path kept;
  for (int n = 1; kept.empty() || std::filesystem::exists(kept); ++n) {
    kept = folder_of(path) / (path.stem().string() + ".unusable-" + utc_stamp() +
                              (n > 1 ? "-" + std::to_string(n) : "") + path.extension().string());
  }
  std::error_code moved;
  std::filesystem::rename(path, kept, moved);
  if (moved) throw Error(moved.message());
  return kept;
}

}  // namespace

void write_atomically(const std::filesystem::path& path, const std::string& data) {
  write_atomically(path, std::vector<std::string_view>{data});
}

void write_atomically(const std::filesystem::path& asked, const std::vector<std::string_view>& parts) {
  const std::filesystem::path path = through_links(asked);
  const std::filesystem::path partial =
      folder_of(path) / ("." + path.filename().string() + ".partial-" + std::to_string(::getpid()));
  // Made afresh, never through a link: its name can be guessed, and a link planted in its place in a shared folder had
  // the state written through it to the file it led to (files.py's _claim). O_EXCL: one planted again is refused.
  if (::unlink(partial.c_str()) != 0 && errno != ENOENT) throw Error(std::strerror(errno));  // a folder there: EISDIR
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  std::FILE* file = fd < 0 ? nullptr : ::fdopen(fd, "w");
  if (fd >= 0 && file == nullptr) ::close(fd);
  bool written = file != nullptr;
  for (const auto part : parts) {
    written = written && std::fwrite(part.data(), 1, part.size(), file) == part.size();
  }
  written = written && std::fflush(file) == 0 && ::fsync(fileno(file)) == 0;
  const std::string why = written ? "" : std::strerror(errno);
  if (file != nullptr && std::fclose(file) != 0 && written) written = false;
  if (written && std::rename(partial.c_str(), path.c_str()) == 0) {
    sync_folder(folder_of(path));
    return;
  }
  const std::string reason = why.empty() ? std::strerror(errno) : why;
  std::remove(partial.c_str());
  throw Error(reason);
}

std::filesystem::path first_closed_folder(const std::filesystem::path& path) {
  std::filesystem::path walked;
  for (const auto& part : std::filesystem::absolute(path).parent_path()) {
    walked /= part;
    if (::access(walked.c_str(), X_OK) != 0) return walked;
  }
  return folder_of(path);
}

std::string unreadable_problem(const std::filesystem::path& path, int access_mode) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) {
    return errno == EACCES ? "cannot be read: this user may not enter " + first_closed_folder(path).string() +
                                 " (Permission denied)"
                           : "";
  }
  if (::access(path.c_str(), access_mode) == 0) return "";
  return "cannot be read: this user may not read it (Permission denied)";
}

void check_path_form(const std::filesystem::path& path, const std::string& named) {
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0) return;
  const int why = errno;
  if (why == ENAMETOOLONG) {
    throw Error(named + " " + path.string() + " has a name longer than its file system holds (" + std::strerror(why) +
                ": most hold 255 bytes a name); give a shorter name");
  }
  if (why == ELOOP) {
    throw Error(named + " " + path.string() + " leads round a loop of symbolic links (" + std::strerror(why) +
                "); give a path whose links end at a file or folder");
  }
}

void check_output_path(const std::filesystem::path& path, const std::string& option, const std::string& example,
                       bool appended) {
  namespace fs = std::filesystem;
  check_path_form(path, option);
  std::error_code error;
  const fs::path folder = folder_of(through_links(path));  // a link's file is made where it leads
  if (fs::is_directory(path, error)) {
    throw Error(option + " " + path.string() + " is a folder; give a file in it (" + (path / example).string() + ")");
  }
  if (appended && fs::exists(path, error)) {
    if (::access(path.c_str(), W_OK) != 0) {
      throw Error(option + " " + path.string() + " cannot be written: " + std::strerror(errno) +
                  "; give a file this user may write");
    }
    return;
  }
  const bool folder_there = fs::is_directory(folder, error);
  if (!folder_there && error == std::errc::permission_denied) {  // a folder above it not entered
    throw Error(option + " " + path.string() + " cannot be written: this user may not enter " +
                first_closed_folder(path).string() + " (" + error.message() +
                "); give a path in a folder this user may write");
  }
  if (!folder_there) {
    throw Error(option + " " + path.string() + ": the folder " + folder.string() + " does not exist; make it first " +
                "(mkdir -p " + folder.string() + ")");
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw Error(option + " " + path.string() + " cannot be written: " + folder.string() + ": " +
                std::strerror(errno) + "; give a path in a folder this user may write");
  }
}

bool same_file(int fd, const std::filesystem::path& path) {
  struct stat opened {}, there {};
  return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &there) == 0 && opened.st_dev == there.st_dev &&
         opened.st_ino == there.st_ino;
}

namespace {

// A file of this run's: an output it holds the lock of (fd >= 0), or a source it reads (fd -1, lock empty).
struct RunFile {
  int fd;
  std::filesystem::path target, lock;
  std::string option, given;  // what gave the file, and the path as given: for a second option naming it
};

// The files of this run; the locks it holds are let go as it exits, each lock file removed first (output_locks.py's
// release_all). A process killed outright leaves its lock files, which stop no one once the kernel lets their locks go.
struct RunFiles {
  std::vector<RunFile> files;
  std::vector<std::pair<std::filesystem::path, std::string>> bundles;  // folders read, never written: (reached, given)
  ~RunFiles() {
    for (const auto& file : files) {
      if (file.fd < 0) continue;
      if (same_file(file.fd, file.lock)) ::unlink(file.lock.c_str());
      ::close(file.fd);
    }
  }
};

RunFiles& run_files() {
  static RunFiles files;
  return files;
}

// What a path reaches, its links and dot-dots resolved as far as it exists (files.py's through_links, Python's
// os.path.realpath): two names of one file are one path.
std::filesystem::path reached(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(through_links(path), error);
  return error ? std::filesystem::absolute(path) : resolved;
}

bool inside(const std::filesystem::path& folder, const std::filesystem::path& path) {
  auto step = path.begin();
  for (const auto& part : folder) {
    if (step == path.end() || *step != part) return false;
    ++step;
  }
  return true;
}

}  // namespace

void reads_source(const std::filesystem::path& source) {
  const std::filesystem::path target = reached(source);
  std::error_code error;
  if (std::filesystem::is_regular_file(target, error)) {
    run_files().files.push_back({-1, target, {}, "--source", source.string()});
  }
}

void reads_bundle(const std::filesystem::path& bundle) {
  const std::filesystem::path folder = reached(bundle);
  std::error_code error;
  if (std::filesystem::is_directory(folder, error)) run_files().bundles.emplace_back(folder, bundle.string());
}

void hold_output(const std::filesystem::path& output, const std::string& option) {
  RunFiles& held = run_files();
  const std::filesystem::path target = reached(output);
  for (const auto& [folder, bundle] : held.bundles) {
    if (inside(folder, target)) {
      throw Error(option + " " + output.string() + " is inside the bundle " + bundle + ", which is read, never " +
                  "written (a re-export replaces it whole); give " + option + " a path outside it");
    }
  }
  for (const auto& other : held.files) {  // a file given to two options: each had written it in turn
    if (other.target != target) continue;
    const std::string use = other.fd < 0 ? "reads: writing there would damage it"
                                         : "writes too: each output needs a file of its own";
    throw Error(option + " " + output.string() + " is the file " + other.option + " " + other.given + " " + use +
                "; give " + option + " another name");
  }
  std::error_code error;
  if (std::filesystem::exists(target, error) && !std::filesystem::is_regular_file(target, error)) return;
  const std::filesystem::path lock = folder_of(target) / ("." + target.filename().string() + ".lock");
  for (;;) {
    // The program's own file, not one the user named: a link there is never followed (one planted in a shared folder
    // such as /tmp would have had the pid written over the file it leads to), nor a file with other names written;
    // another user's lock file is opened to read, which is all a lock needs (output_locks.py's _open_lock).
    constexpr int kFlags = O_CREAT | O_CLOEXEC | O_NOFOLLOW;
    int fd = ::open(lock.c_str(), O_RDWR | kFlags, 0644);
    if (fd < 0 && errno == EACCES) fd = ::open(lock.c_str(), O_RDONLY | kFlags);
    if (fd < 0) return;  // a folder this user may not create in, a link in the lock's place: unlocked
    struct stat opened {};
    if (::fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode) || opened.st_nlink != 1) {
      ::close(fd);
      return;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int failure = errno;
      char words[200] = {};
      const ssize_t got = ::pread(fd, words, sizeof words - 1, 0);
      ::close(fd);
      if (failure != EWOULDBLOCK) return;  // ENOLCK, EOPNOTSUPP: a file system without locks
      std::string holder = "a process that has only just started";
      int pid = 0;
      char program[64] = {};
      if (got > 0 && std::sscanf(words, "%d %63s", &pid, program) == 2 && pid > 0) {
        holder = "pid " + std::to_string(pid) + ", " + program;
      }
      throw Error(option + " " + output.string() + " is being written by another run (" + holder +
                  "); stop that run, or give this one another file");
    }
    if (same_file(fd, lock)) {
      const std::string holder = std::to_string(::getpid()) + " sdqes-run\n";
      if (opened.st_uid == ::geteuid() && ::ftruncate(fd, 0) == 0) {
        (void)!::pwrite(fd, holder.data(), holder.size(), 0);
      }
      held.files.push_back({fd, target, lock, option, output.string()});
      return;
    }
    ::close(fd);  // the lock file was replaced between its open and its lock: lock the one there now
  }
}

void set_aside_unusable(const std::filesystem::path& path, const std::string& named, const std::string& problem,
                        const std::string& fresh, const std::function<void(const std::string&)>& log) {
  const std::string said = named + " " + path.string() + " " + problem;
  std::filesystem::path kept;
  try {
    kept = set_aside(path);
  } catch (const Error& moved) {
    throw Error(said + ", and it cannot be set aside (" + moved.what() + "); move it away, and " + fresh);
  }
  log("warning: " + said + ": " + fresh + "; that file is kept as " + kept.string());
}

}  // namespace sdqes
