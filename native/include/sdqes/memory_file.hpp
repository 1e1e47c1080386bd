// The model's memory of one stream kept across a restart: sdqes-run --state keeps it beside each stream's alert
// states, a C API caller through sdqes_step_save_memory and sdqes_step_load_memory. Without it a restarted service's
// temporal adapters start cold: its first scores after a restart are those of a model that has seen one frame, as
// the Python runtime's snapshots (which keep the state too) avoid.
//
// The file: a line naming the format; a line of JSON, what the memory belongs to (the model identity, each state
// tensor's name, element size and bytes per stream); then the stream's state, StepBackend::stream_state's bytes.
// Written atomically. It is tied to the model by its identity and to the step graph's state by each tensor's name and
// element size: a file of another is refused, except the memory of the same tensors kept by the model's graph of the
// other precision (fp16 for fp32, or fp32 for fp16), which is converted, as the Python runtime's snapshots are.
#pragma once

#include <filesystem>
#include <cstdint>
#include <string>
#include <vector>

#include "sdqes/runtime.hpp"
#include "sdqes/step_backend.hpp"

namespace sdqes {

// Throws Error("cannot write PATH: the reason (the file there, if any, is unchanged)").
void save_memory(const std::filesystem::path& path, const OpenedStep& step, int stream);
// save_memory in two: the file's contents taken from the step now, and written later (sdqes-run writes them on a
// thread of its own, sdqes/background_saves.hpp, while the step goes on). write_memory throws as save_memory does.
struct MemoryContents {
  std::string header;          // the format line and the JSON line
  std::vector<uint8_t> state;  // StepBackend::stream_state's copy
};
MemoryContents memory_contents(const OpenedStep& step, int stream);
void write_memory(const std::filesystem::path& path, const MemoryContents& contents);

// A memory file that cannot be given to the step: "PATH <problem>; remove it, and the stream starts fresh".
struct UnusableMemory : Error {
  UnusableMemory(const std::filesystem::path& path, const std::string& problem_words);
  std::string problem;  // "is damaged (its header is not JSON)"
};

// The memory save_memory wrote, given to `stream`. -> "" where it was this graph's own; "fp16" (or "fp32") where it
// was kept by the graph of that precision and converted. Throws UnusableMemory where the file is not one, is damaged,
// is another model's or holds a state of another layout (another export; an fp32 value past fp16's range for an fp16
// graph); the step is then as it was. An Error where it cannot be read, or the stream is out of range.
std::string load_memory(const std::filesystem::path& path, OpenedStep& step, int stream);

}  // namespace sdqes
