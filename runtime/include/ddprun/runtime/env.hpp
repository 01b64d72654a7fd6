#pragma once
// The contract a launcher (ddprun or torchrun) hands its workers, read from the environment.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace ddprun::runtime {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int restart_count = 0;        // TORCHELASTIC_RESTART_COUNT (0 when unset)
  std::string master_addr;      // the store
  std::uint16_t master_port = 0;
  std::string run_id;           // TORCHELASTIC_RUN_ID ("none" when unset)
  std::string heartbeat_file;   // DDPRUN_HEARTBEAT_FILE (empty when unset)
  // DDPRUN_NCCL_SHARE_DEVICES: 1/true/yes/on let more ranks than GPUs share this machine's
  // devices (ProcessGroupOptions::share_devices); 0/false/no/off or unset: they may not.
  bool share_devices = false;
  // No launcher variable (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
  // MASTER_PORT) was set at all: a world of one (rank 0 of 1), which init_process_group runs
  // on a store in the process, with a one-line notice on stderr.
  bool standalone = false;

  // Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required
  // once any of them is set; none at all is a world of one, see standalone) and the optional
  // variables. Throws ddprun::UsageError naming the variable that is missing or malformed, e.g.
  // "RANK=abc is not an integer (set by ddprun or torchrun)".
  static DistEnv from_environment();
  // The same, from a map (tests).
  static DistEnv from_map(const std::map<std::string, std::string>& env);
};

}  // namespace ddprun::runtime
