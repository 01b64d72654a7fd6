#include "ddprun/runtime/env.hpp"

#include <charconv>
#include <cstdlib>

#include "ddprun/rendezvous/error.hpp"

extern char** environ;

namespace ddprun::runtime {
namespace {

const char* kHint = " (these are set by ddprun or torchrun: start the program through one of them)";

std::string required(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) throw UsageError("environment variable " + key + " is not set" + kHint);
  return it->second;
}

long long integer(const std::string& key, const std::string& value, long long lo, long long hi) {
  long long v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw UsageError(key + "=" + value + " is not an integer" + kHint);
  }
  if (v < lo || v > hi) {
    throw UsageError(key + "=" + value + " is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) + ")" + kHint);
  }
  return v;
}

}  // namespace

DistEnv DistEnv::from_map(const std::map<std::string, std::string>& env) {
  DistEnv e;
  e.world_size = static_cast<int>(integer("WORLD_SIZE", required(env, "WORLD_SIZE"), 1, 1 << 24));
  e.rank = static_cast<int>(integer("RANK", required(env, "RANK"), 0, e.world_size - 1));
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
  return e;
}

DistEnv DistEnv::from_environment() {
  std::map<std::string, std::string> env;
  for (char** p = environ; *p; ++p) {
    std::string kv = *p;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return from_map(env);
}

}  // namespace ddprun::runtime
