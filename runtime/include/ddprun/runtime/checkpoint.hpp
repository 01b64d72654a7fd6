#pragma once
// Checkpoints that survive crashes: written to a temporary file, synced, then renamed over the
// old one, so a crash at any moment leaves either the previous checkpoint or the new one, never
// a torn file. The file carries a length and a checksum; a damaged file is reported, not loaded.

#include <optional>
#include <string>
#include <string_view>

namespace ddprun::runtime {

class ProcessGroup;

// Writes `data` to `path` atomically. Throws ddprun::Error naming the path and the reason.
void save_checkpoint(const std::string& path, std::string_view data);
// The data of the checkpoint at `path`; nullopt when there is none. Throws ddprun::Error when
// the file exists but is damaged.
std::optional<std::string> load_checkpoint(const std::string& path);
// Rank 0 saves; every rank returns once the checkpoint is on disk (a barrier), so none races
// ahead of a checkpoint it may later need.
void save_checkpoint_on_rank0(ProcessGroup& group, const std::string& path, std::string_view data);

}  // namespace ddprun::runtime
