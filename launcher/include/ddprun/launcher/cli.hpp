#pragma once
// ddprun's command line: torchrun's flags (both spellings, PET_<DEST> environment fallbacks),
// turned into the agent's options. Bad input throws ddprun::UsageError with a message that
// says what was wrong and what to do; main prints it and exits 2.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.hpp"

namespace ddprun::launcher {

struct CliResult {
  // When set, print `text` to stdout and exit 0 (--help, --version).
  bool exit_now = false;
  std::string text;
  agent::AgentOptions agent;
  std::string log_level = "info";
  // Said once at info level when logging starts (e.g. what was derived from Slurm).
  std::vector<std::string> notes;
};

// What the launcher needs from the machine, injectable for tests.
struct HostInfo {
  int cpus = 1;
  std::function<int()> count_gpus = [] { return 0; };  // called only for --nproc_per_node gpu/auto
};
HostInfo probe_host();

// `args` excludes argv[0]; `env` is the launcher's environment.
CliResult parse_command_line(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                             const HostInfo& host);

std::string version_string();

}  // namespace ddprun::launcher
