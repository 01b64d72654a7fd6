#pragma once
// ddprun's options, all in one table: name, default, help group, help text, and the parser that
// validates one value and stores it in Settings. The option descriptions (--help, the man page),
// the PET_<NAME> fallbacks, the bash completion and the validation are all generated from it.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.hpp"

namespace ddprun::launcher {

// Every option's value, parsed and checked on its own (cross-option checks: cli.cpp).
struct Settings {
  std::string nproc_per_node;  // resolved with the host's CPUs and GPUs later
  int min_nodes = 1, max_nodes = 1;
  std::string nnodes_text;
  int node_rank = 0;
  std::string role;
  int max_restarts = 0;
  bool standalone = false;
  std::string master_addr;
  std::uint16_t master_port = 0;
  std::string rdzv_backend;
  std::string rdzv_endpoint;
  bool rdzv_endpoint_from_slurm = false;  // (c10d's, derived: a static store stays at --master_addr)
  // Where an option's value came from when not a flag: "PET_NODE_RANK", "SLURM_NODEID" (by option
  // name), for messages that must name what the user can change.
  std::map<std::string, std::string> origin;
  std::string rdzv_id;
  std::map<std::string, std::string> rdzv_conf;
  std::string rdzv_conf_twice;  // a key given twice: an error where --rdzv_conf applies (not --standalone)
  std::string local_addr;
  bool worker_timeout_auto = true;
  std::chrono::milliseconds worker_timeout{0}, stop_timeout{0}, stack_dump_timeout{0}, hang_floor{0}, hang_stop{0};
  std::optional<std::chrono::milliseconds> worker_start_timeout;  // unset: 1800 s with S, none with auto
  std::set<int> signals;
  bool module = false, no_python = false;
  bool no_progress_hook = false;
  bool warm_spares = true;     // for Python workers (docs: Warm spares)
  std::string preload;         // modules each warm spare imports besides torch
  long long state_memory = -1; // bytes for the node's state areas; -1: the default; 0: none
  bool no_state = false;
  long long state_copy_rate = 1LL << 30;  // bytes a second to the buddy node; 0: no copies
  std::string log_dir;
  agent::StreamSelection redirects, tee;
  std::string local_ranks_filter;
  std::string log_level;
  std::string events_file;
  std::string logs_specs, event_log_handler;  // torchrun 2.x's plug-ins: accepted, said to be ignored
  std::string numa_binding;
  bool report_bindings = false;
  int max_same_failures = 0;
  std::optional<std::chrono::milliseconds> shutdown_timeout;  // torchrun 2.x's name for stop_timeout
  bool virtual_local_rank = false;
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  std::string log_line_prefix_template;  // empty: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else the default
  std::string metrics_addr;
  int metrics_port = -1;  // -1: off
};

enum class OptionKind { value, flag, action };  // action: --help, --version, --completion

struct OptionSpec {
  const char* name;           // torchrun's spelling; --name-with-hyphens is accepted too
  const char* short_name;     // "m", or "" for none
  const char* group;          // the --help section
  OptionKind kind;
  const char* default_value;  // value options
  const char* help;
  void (*parse)(const std::string& value, Settings& s);  // throws UsageError naming the option
};

const std::vector<OptionSpec>& option_table();

// "--nproc-per-node" -> "--nproc_per_node" (torchrun accepts both spellings).
std::string normalize_option(const std::string& arg);
// "PET_NPROC_PER_NODE" for "nproc_per_node".
std::string pet_name(const std::string& option);
bool truthy(const std::string& v);
// env[k], or `def` when it is not set.
std::string get_env(const std::map<std::string, std::string>& env, const std::string& k, const std::string& def);

// Helpers shared with cli.cpp.
[[noreturn]] void usage(const std::string& what);
std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& v, bool allow_zero);
int parse_count(const std::string& flag, const std::string& v, bool allow_zero);
// "4G", "512M", "1.5G", "65536" (bytes), "0": a size in bytes (K, M, G, T: powers of 1024; an
// optional "B" or "iB" after them).
long long parse_size(const std::string& flag, const std::string& v);
// A value cut to about 60 characters for a message.
std::string shorten(const std::string& v);// Comma-separated Python module names (--preload); throws UsageError naming the flag.
std::string parse_module_list(const std::string& flag, const std::string& v);
std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& v, std::uint16_t default_port);

}  // namespace ddprun::launcher
