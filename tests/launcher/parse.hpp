#pragma once
// The launcher's command line parsed on a made-up host of 6 CPUs and `gpus` GPUs, with a PATH
// unless `env` gives one: how the launcher tests parse one.

#include <map>
#include <string>
#include <vector>

#include "ddprun/launcher/cli.hpp"

namespace ddprun::test {

inline launcher::CliResult parse(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                                 int gpus = 0) {
  launcher::HostInfo host;
  host.cpus = 6;
  host.count_gpus = [gpus] { return gpus; };
  if (!env.count("PATH")) env["PATH"] = "/usr/bin:/bin";
  return launcher::parse_command_line(args, env, host);
}

}  // namespace ddprun::test
