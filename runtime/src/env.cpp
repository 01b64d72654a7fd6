#include "ddprun/common/text.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/runtime/env.hpp"

#include <charconv>
#include <cstdlib>

#include "ddprun/common/error.hpp"

namespace ddprun::runtime {
namespace {

const char* kHint = " (these are set by ddprun or torchrun: start the program through one of them)";

std::string required(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) throw UsageError("environment variable " + key + " is not set" + kHint);
  return it->second;
}

long long integer(const std::string& key, const std::string& value, long long lo, long long hi) {
  auto parsed = parse_int(value);
  if (!parsed) {
    throw UsageError(key + "=" + value + " is not an integer" + kHint);
  }
  long long v = *parsed;
  if (v < lo || v > hi) {
    throw UsageError(key + "=" + value + " is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) + ")" + kHint);
  }
  return v;
}

bool yes_no(const std::string& key, const std::string& value) {
  for (const char* yes : {"1", "true", "yes", "on"}) {
    if (value == yes) return true;
  }
  for (const char* no : {"", "0", "false", "no", "off"}) {
    if (value == no) return false;
  }
  throw UsageError(key + "=" + value + " is not one of 1, true, yes, on, 0, false, no, off");
}

}  // namespace

DistEnv DistEnv::from_map(const std::map<std::string, std::string>& env) {
  DistEnv e;
  bool any = false;
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    auto it = env.find(k);
    any = any || (it != env.end() && !it->second.empty());
  }
  if (!any) {
    e.standalone = true;
    e.run_id = "none";
    return e;
  }
  // RANK first: a program started by hand with a wrong or missing RANK hears about RANK.
  const std::string rank_text = required(env, "RANK");
  const auto rank = integer("RANK", rank_text, 0, (1 << 24) - 1);
  e.world_size = static_cast<int>(integer("WORLD_SIZE", required(env, "WORLD_SIZE"), 1, 1 << 24));
  if (rank >= e.world_size) {
    throw UsageError("RANK=" + rank_text + " is out of range (0.." + std::to_string(e.world_size - 1) +
                     ", since WORLD_SIZE=" + std::to_string(e.world_size) + ")" + kHint);
  }
  e.rank = static_cast<int>(rank);
  e.local_world_size = static_cast<int>(integer("LOCAL_WORLD_SIZE", required(env, "LOCAL_WORLD_SIZE"), 1, e.world_size));
  e.local_rank = static_cast<int>(integer("LOCAL_RANK", required(env, "LOCAL_RANK"), 0, e.local_world_size - 1));
  e.master_addr = required(env, "MASTER_ADDR");
  e.master_port = static_cast<std::uint16_t>(integer("MASTER_PORT", required(env, "MASTER_PORT"), 1, 65535));
  if (auto it = env.find("TORCHELASTIC_RESTART_COUNT"); it != env.end() && !it->second.empty()) {
    e.restart_count = static_cast<int>(integer("TORCHELASTIC_RESTART_COUNT", it->second, 0, 1 << 30));
  }
  auto get = [&](const char* k, const char* def) {
    auto it = env.find(k);
    return it == env.end() ? std::string(def) : it->second;
  };
  e.run_id = get("TORCHELASTIC_RUN_ID", "none");
  e.heartbeat_file = get("DDPRUN_HEARTBEAT_FILE", "");
  e.share_devices = yes_no("DDPRUN_NCCL_SHARE_DEVICES", get("DDPRUN_NCCL_SHARE_DEVICES", ""));
  return e;
}

DistEnv DistEnv::from_environment() {
  return from_map(environment_map());
}

}  // namespace ddprun::runtime
