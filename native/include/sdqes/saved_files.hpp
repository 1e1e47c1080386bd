// Files a run keeps across a restart (sdqes-run --state): written atomically, and one that cannot be used set aside
// rather than deleted (it is the user's).
#pragma once

#include <filesystem>
#include <string>

namespace sdqes {

// `data` written to `path` atomically: to a partial file beside it, synced to the disk, renamed over it, the folder
// synced. The old file or the new one, whole, even across a power cut. Throws Error(the reason) where it cannot.
void write_atomically(const std::filesystem::path& path, const std::string& data);

// `path` renamed beside itself as NAME.unusable-<UTC stamp>EXT (state.unusable-20261128T031502Z.json) -> that name.
// Throws Error(the reason) where it cannot be.
std::filesystem::path set_aside(const std::filesystem::path& path);

}  // namespace sdqes
