#include "option_table.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>

#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::launcher {
namespace {

void parse_nnodes(const std::string& v, Settings& s) {
  s.nnodes_text = v;
  auto parts = split(v, ':');
  if (v.find(':') == std::string::npos) {
    s.min_nodes = s.max_nodes = parse_count("nnodes", v, false);
    return;
  }
  if (parts.size() != 2) usage("--nnodes must be N or MIN:MAX (got '" + v + "')");
  auto lo = parse_int(parts[0], 1, 1'000'000), hi = parse_int(parts[1], 1, 1'000'000);
  if (!lo || !hi) usage("--nnodes must be N or MIN:MAX with numbers from 1 to 1000000 (got '" + v + "')");
  if (*lo > *hi) usage("--nnodes=" + v + ": MIN is larger than MAX");
  s.min_nodes = static_cast<int>(*lo);
  s.max_nodes = static_cast<int>(*hi);
}

std::uint16_t parse_port(const std::string& flag, const std::string& v) {
  auto n = parse_int(v, 0, 65535);
  if (!n) usage("--" + flag + " must be a port number 0-65535 (got '" + v + "')");
  return static_cast<std::uint16_t>(*n);
}

agent::StreamSelection parse_streams(const std::string& flag, const std::string& v) {
  agent::StreamSelection s;
  auto value = [&](const std::string& x) {
    auto n = parse_int(trim(x), 0, 3);
    if (!n) usage("--" + flag + " values are 0 (none), 1 (stdout), 2 (stderr) or 3 (both) (got '" + v + "')");
    return static_cast<int>(*n);
  };
  if (v.find(':') == std::string::npos) {
    s.all = value(v);
    return s;
  }
  for (const auto& item : split(v, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) usage("--" + flag + " per-rank form is RANK:VALUE,... (got '" + v + "')");
    auto rank = parse_int(trim(item.substr(0, colon)), 0, 1'000'000);
    if (!rank) usage("--" + flag + ": bad local rank in '" + item + "'");
    if (!s.per_rank.emplace(static_cast<int>(*rank), value(item.substr(colon + 1))).second) {
      usage("--" + flag + "='" + v + "' gives local rank " + std::to_string(*rank) + " twice: give each rank once");
    }
  }
  return s;
}

std::set<int> parse_signals(const std::string& v) {
  std::set<int> out = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  const auto allowed = stop_signals();
  for (const auto& raw : split(v, ',')) {
    std::string name = trim(raw);
    if (name.empty()) continue;
    int s = parse_signal(name);
    if (!s || std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
      usage("--signals_to_handle: '" + name + "' is not a signal that ends a process from outside "
            "(SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF, SIGIO, "
            "SIGPWR, SIGSTKFLT, SIGRTMIN, SIGRTMIN+N)");
    }
    out.insert(s);
  }
  return out;
}

std::map<std::string, std::string> parse_conf(const std::string& v, std::string& twice) {
  std::map<std::string, std::string> conf;
  for (const auto& kv : split(v, ',')) {
    if (trim(kv).empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos) usage("--rdzv_conf items are KEY=VALUE (got '" + kv + "')");
    const std::string key = trim(kv.substr(0, eq)), value = trim(kv.substr(eq + 1));
    if (auto [it, fresh] = conf.emplace(key, value); !fresh && twice.empty()) {
      twice = "--rdzv_conf " + key + " is given twice ('" + it->second + "' and '" + value + "'): keep one";
    }
  }
  return conf;
}

// The run id names a directory under the log directory: anything that could climb out of it or
// name something else is refused.
std::string parse_run_id(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 128 && id != "." && id != "..";
  for (char c : id) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (!ok) {
    usage("--rdzv_id='" + (id.size() > 140 ? id.substr(0, 140) + "..." : id) +
          "' is not a valid run id: use 1-128 of the characters A-Z a-z 0-9 . _ - (not '.' or '..'), e.g. job-42");
  }
  return id;
}

std::string parse_log_level(const std::string& v) {
  for (const char* ok : {"trace", "debug", "info", "warn", "error", "off"}) {
    if (v == ok) return v;
  }
  usage("--log_level must be trace, debug, info, warn, error or off (got '" + v + "')");
}

std::string not_empty(const char* flag, const std::string& v) {
  if (v.empty()) usage(std::string("--") + flag + " must not be empty");
  return v;
}

// A value as a message quotes it: a 100,000-character one is cut to its first 60.

// A host name or an address, refused before it goes to the resolver when DNS could not hold it.
std::string host_name(const char* flag, const std::string& v) {
  if (auto why = host_name_problem(v); !why.empty()) usage(std::string("--") + flag + "='" + shorten(v) + "': " + why);
  return v;
}

// torchrun's comma-separated list: ",," is a literal comma; empty items are dropped.
std::vector<std::string> parse_filters(const std::string& v) {
  std::vector<std::string> out;
  std::string item;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != ',') {
      item += v[i];
    } else if (i + 1 < v.size() && v[i + 1] == ',') {
      item += ',';
      ++i;
    } else {
      if (!item.empty()) out.push_back(item);
      item.clear();
    }
  }
  if (!item.empty()) out.push_back(item);
  return out;
}

constexpr const char* kWorkers = "Worker group";
constexpr const char* kRdzv = "Rendezvous";
constexpr const char* kFault = "Failures and hangs";
constexpr const char* kProgram = "Program";
constexpr const char* kOutput = "Output and logs";
constexpr const char* kGeneral = "General";
using K = OptionKind;

}  // namespace

void usage(const std::string& what) { throw UsageError(what); }

namespace {

// How many workers, which node, how they are bound.
std::vector<OptionSpec> worker_options() {
  return {
    {"nproc_per_node", "", kWorkers, K::value, "1",
     "workers on this node: a number, 'cpu' (one per CPU), 'gpu' (one per GPU) or 'auto' (GPUs, else CPUs)",
     [](const std::string& v, Settings& s) {
       // (checked here, so that a bad PET_NPROC_PER_NODE is named; 'gpu' and 'auto' count GPUs later)
       if (v != "cpu" && v != "gpu" && v != "auto" && !parse_int(v, 1, 100'000)) {
         usage("--nproc_per_node must be a positive integer, 'cpu', 'gpu' or 'auto' (got '" + shorten(v) + "')");
       }
       s.nproc_per_node = v;
     }},
    {"nnodes", "", kWorkers, K::value, "1:1", "number of nodes, N or MIN:MAX", parse_nnodes},
    {"node_rank", "", kWorkers, K::value, "0", "rank of this node (static rendezvous)",
     [](const std::string& v, Settings& s) { s.node_rank = parse_count("node_rank", v, true); }},
    {"role", "", kWorkers, K::value, "default", "role name of the workers (ROLE_NAME)",
     [](const std::string& v, Settings& s) { s.role = not_empty("role", v); }},
    {"max_restarts", "", kWorkers, K::value, "0", "restarts of the worker group before giving up",
     [](const std::string& v, Settings& s) { s.max_restarts = parse_count("max_restarts", v, true); }},
    {"numa_binding", "", kWorkers, K::value, "",
     "bind each local rank's CPUs and memory: node, socket, exclusive or core-complex (hwloc; nearest its GPU "
     "on GPU nodes)",
     [](const std::string& v, Settings& s) {
       if (!v.empty() && v != "node" && v != "socket" && v != "exclusive" && v != "core-complex" && v != "core_complex") {
         usage("--numa_binding must be node, socket, exclusive or core-complex (got '" + v + "')");
       }
       s.numa_binding = v;
     }},
    {"report_bindings", "", kWorkers, K::flag, "", "print each local rank's CPUs and NUMA node",
     [](const std::string& v, Settings& s) { s.report_bindings = truthy(v); }},
    {"virtual_local_rank", "", kWorkers, K::flag, "",
     "each worker sees only its own GPU: LOCAL_RANK=0, CUDA_VISIBLE_DEVICES its device (torchrun 2.x)",
     [](const std::string& v, Settings& s) { s.virtual_local_rank = truthy(v); }},
  };
}

// How the nodes meet.
std::vector<OptionSpec> rendezvous_options() {
  return {
    {"standalone", "", kRdzv, K::flag, "", "single node: the store on 127.0.0.1, a free port, a random run id",
     [](const std::string& v, Settings& s) { s.standalone = truthy(v); }},
    {"master_addr", "", kRdzv, K::value, "127.0.0.1", "address of the store (static rendezvous)",
     [](const std::string& v, Settings& s) { s.master_addr = host_name("master_addr", v); }},
    {"master_port", "", kRdzv, K::value, "29500", "port of the store (static rendezvous)",
     [](const std::string& v, Settings& s) { s.master_port = parse_port("master_port", v); }},
    {"rdzv_backend", "", kRdzv, K::value, "static", "static, c10d (ddprun's store, hosted by an agent) or etcd (an etcd v3 cluster)",
     [](const std::string& v, Settings& s) {
       if (v == "etcd-v2") usage("--rdzv_backend=etcd-v2: etcd's v2 API is gone from etcd 3.6; use etcd (ddprun speaks v3)");
       if (v != "static" && v != "c10d" && v != "etcd") {
         usage("--rdzv_backend must be 'static', 'c10d' or 'etcd' (got '" + v + "')");
       }
       s.rdzv_backend = v;
     }},
    {"rdzv_endpoint", "", kRdzv, K::value, "", "host[:port] of the rendezvous store (c10d)",
     [](const std::string& v, Settings& s) {
       // etcd's lists and URLs are checked with the backend (rdzv_flags.cpp)
       if (!v.empty() && v.find(',') == std::string::npos && v.find("://") == std::string::npos) parse_endpoint(v, 0);
       s.rdzv_endpoint = v;
     }},
    {"rdzv_id", "", kRdzv, K::value, "none", "job id shared by all nodes (TORCHELASTIC_RUN_ID)",
     [](const std::string& v, Settings& s) { s.rdzv_id = parse_run_id(v); }},
    {"rdzv_conf", "", kRdzv, K::value, "", "key=value,... rendezvous settings",
     [](const std::string& v, Settings& s) { s.rdzv_conf = parse_conf(v, s.rdzv_conf_twice); }},
    {"local_addr", "", kRdzv, K::value, "", "this node's address as other nodes see it",
     [](const std::string& v, Settings& s) { s.local_addr = v.empty() ? v : host_name("local_addr", v); }},
  };
}

// Failures, hangs, stops.
std::vector<OptionSpec> failure_options() {
  return {
    {"worker_timeout", "", kFault, K::value, "auto",
     "when a worker that beats (Python workers beat through ddprun's progress hook, native ones through the "
     "runtime) counts as hung: 'auto' once silent for the larger of --hang_floor and 5x its recent long steps, "
     "after its first step; S seconds after its last beat; 0 = never. A hung worker is reported first (every "
     "rank's stack and a verdict), then stopped (exit 124)",
     [](const std::string& v, Settings& s) {
       s.worker_timeout_auto = v == "auto";
       if (!s.worker_timeout_auto && !parse_double(v)) {
         usage("--worker_timeout must be 'auto', a number of seconds, or 0 (off) (got '" + shorten(v) + "')");
       }
       s.worker_timeout = s.worker_timeout_auto ? std::chrono::milliseconds(0) : parse_seconds("worker_timeout", v, true);
     }},
    {"worker_start_timeout", "", kFault, K::value, "",
     "seconds from a worker's start to its first beat (--worker_timeout=S; default 1800) or its first optimizer "
     "step (auto; default: no bound, however long the first step takes); 0 = no bound",
     [](const std::string& v, Settings& s) {
       if (!v.empty()) s.worker_start_timeout = parse_seconds("worker_start_timeout", v, true);
     }},
    {"hang_floor", "", kFault, K::value, "30",
     "with --worker_timeout=auto: the shortest silence that counts as a hang (longer than a slow checkpoint save)",
     [](const std::string& v, Settings& s) { s.hang_floor = parse_seconds("hang_floor", v, false); }},
    {"hang_stop", "", kFault, K::value, "120",
     "with --worker_timeout=auto: seconds from a hang's report to the workers' stop, unless the silent worker "
     "makes progress again (0 = at the report)",
     [](const std::string& v, Settings& s) { s.hang_stop = parse_seconds("hang_stop", v, true); }},
    {"no_progress_hook", "", kFault, K::flag, "",
     "do not give Python workers ddprun's sitecustomize, which beats in DDPRUN_HEARTBEAT_FILE (optimizer steps, "
     "forward passes), lets ddprun read their stacks without stopping them, and sets NCCL_ASYNC_ERROR_HANDLING "
     "for PyTorch 1.x only",
     [](const std::string& v, Settings& s) { s.no_progress_hook = truthy(v); }},
    {"warm_spares", "", kFault, K::value, "1",
     "keep one warm spare interpreter per local rank for Python workers, which has imported torch (and --preload's "
     "modules) and takes over at a restart instead of a new interpreter (0 = off: every restart starts cold)",
     [](const std::string& v, Settings& s) {
       if (v != "0" && v != "1") usage("--warm_spares must be 0 or 1 (got '" + v + "')");
       s.warm_spares = v == "1";
     }},
    {"state_memory", "", kFault, K::value, "",
     "memory for the workers' in-memory state (ddprun.state.save) on this node, split evenly between its local "
     "ranks, e.g. 8G; a save holds at most half its rank's share (two slots); pages are used only as saves write "
     "them. Default: a quarter of the node's memory (or of ddprun's cgroup memory limit if lower); 0 = none",
     [](const std::string& v, Settings& s) {
       if (!v.empty()) s.state_memory = parse_size("state_memory", v);
     }},
    {"state_copy_rate", "", kFault, K::value, "1G",
     "in a job of several nodes, the pace at which each node copies its ranks' saved state to its buddy node (the "
     "next group rank), in bytes a second, e.g. 500M; a node lost keeps its ranks' state there. 0 = no copies",
     [](const std::string& v, Settings& s) { s.state_copy_rate = parse_size("state_copy_rate", v); }},
    {"no_state", "", kFault, K::flag, "",
     "give the workers no in-memory state (as --state_memory=0): ddprun.state.load() returns None",
     [](const std::string& v, Settings& s) { s.no_state = truthy(v); }},
    {"preload", "", kFault, K::value, "",
     "comma-separated modules each warm spare imports besides torch, before the script runs; 'auto' adds those the "
     "last attempt's worker had imported (installed ones) at its first optimizer step",
     [](const std::string& v, Settings& s) { s.preload = parse_module_list("preload", v); }},
    {"stop_timeout", "", kFault, K::value, "5", "seconds between SIGTERM and SIGKILL when stopping workers",
     [](const std::string& v, Settings& s) { s.stop_timeout = parse_seconds("stop_timeout", v, false); }},
    {"stack_dump_timeout", "", kFault, K::value, "10",
     "before a hung group is stopped, collect every worker's stack for at most this many seconds (0 = off)",
     [](const std::string& v, Settings& s) { s.stack_dump_timeout = parse_seconds("stack_dump_timeout", v, true); }},
    {"signals_to_handle", "", kFault, K::value, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "signals forwarded to the workers (SIGTERM, SIGINT, SIGHUP, SIGQUIT and any of SIGUSR1, SIGUSR2, SIGALRM, ...); any other terminating signal stops the job",
     [](const std::string& v, Settings& s) { s.signals = parse_signals(v); }},
    {"shutdown_timeout", "", kFault, K::value, "",
     "torchrun 2.x's name for --stop_timeout (seconds); also TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
     [](const std::string& v, Settings& s) {
       if (!v.empty()) s.shutdown_timeout = parse_seconds("shutdown_timeout", v, false);
     }},
    {"max_same_failures", "", kFault, K::value, "0",
     "end the job with exit code 93 (a crash loop: do not requeue) when the same rank fails the same way on "
     "this many consecutive attempts (0 = off)",
     [](const std::string& v, Settings& s) { s.max_same_failures = parse_count("max_same_failures", v, true); }},
    {"monitor_interval", "", kFault, K::value, "0.1",
     "accepted for torchrun compatibility; ddprun sees worker exits as they happen",
     [](const std::string& v, Settings&) {  // (any number torchrun takes: it is not used)
       if (auto d = parse_double(v); !d || *d < 0) {
         usage("--monitor_interval must be a non-negative number of seconds (got '" + shorten(v) + "')");
       }
     }},
  };
}

// What the workers run.
std::vector<OptionSpec> program_options() {
  return {
    {"module", "m", kProgram, K::flag, "", "run the program as a Python module (python -m)",
     [](const std::string& v, Settings& s) { s.module = truthy(v); }},
    {"no_python", "", kProgram, K::flag, "", "execute the program directly, not through Python",
     [](const std::string& v, Settings& s) { s.no_python = truthy(v); }},
    {"run_path", "", kProgram, K::flag, "", "accepted for compatibility: runs the script with Python like the default",
     [](const std::string&, Settings&) {}},
    {"start_method", "", kProgram, K::value, "spawn", "accepted for compatibility (spawn, fork, forkserver)",
     [](const std::string& v, Settings&) {
       if (v != "spawn" && v != "fork" && v != "forkserver") {
         usage("--start_method must be spawn, fork or forkserver, as torchrun's (got '" + v + "'); ddprun starts "
               "every worker the same way whichever is given");
       }
     }},
  };
}

// Where output goes.
std::vector<OptionSpec> output_options() {
  return {
    {"log_dir", "", kOutput, K::value, "", "per-rank logs: LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK/{stdout,stderr}.log (several nodes: LOG_DIR/RUN_ID/HOST.PID/...)",
     [](const std::string& v, Settings& s) { s.log_dir = v; }},
    {"redirects", "r", kOutput, K::value, "0",
     "streams to files only: 0 none, 1 stdout, 2 stderr, 3 both; per rank as 0:1,1:2",
     [](const std::string& v, Settings& s) { s.redirects = parse_streams("redirects", v); }},
    {"tee", "t", kOutput, K::value, "0", "streams to files and the console, values as --redirects",
     [](const std::string& v, Settings& s) { s.tee = parse_streams("tee", v); }},
    {"local_ranks_filter", "", kOutput, K::value, "", "local ranks shown on the console, e.g. 0 or 0,2",
     [](const std::string& v, Settings& s) { s.local_ranks_filter = v; }},
    {"log_line_prefix_template", "", kOutput, K::value, "",
     "console line prefix with ${role_name}, ${local_rank}, ${rank}; also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE "
     "(default [${role_name}${local_rank}]:)",
     [](const std::string& v, Settings& s) { s.log_line_prefix_template = v; }},
    {"duplicate_stdout_filters", "", kOutput, K::value, "",
     "copy stdout lines holding any of these comma-separated substrings (',,' is a comma) to "
     "LOG_DIR/RUN_ID/attempt_N/filtered_stdout.log",
     [](const std::string& v, Settings& s) { s.duplicate_stdout_filters = parse_filters(v); }},
    {"duplicate_stderr_filters", "", kOutput, K::value, "", "as --duplicate_stdout_filters, for stderr (filtered_stderr.log)",
     [](const std::string& v, Settings& s) { s.duplicate_stderr_filters = parse_filters(v); }},
    {"log_level", "", kOutput, K::value, "info", "ddprun's own messages: trace, debug, info, warn, error, off",
     [](const std::string& v, Settings& s) { s.log_level = parse_log_level(v); }},
    {"events_file", "", kOutput, K::value, "",
     "append machine-readable events (JSON Lines) to this file; also DDPRUN_EVENTS_FILE",
     [](const std::string& v, Settings& s) { s.events_file = v; }},
    {"logs_specs", "", kOutput, K::value, "",
     "accepted for torchrun 2.x compatibility (its LogsSpecs plug-in): ddprun writes the logs itself, as --log_dir, "
     "--redirects and --tee say",
     [](const std::string& v, Settings& s) { s.logs_specs = v; }},
    {"event_log_handler", "", kOutput, K::value, "null",
     "accepted for torchrun 2.x compatibility (its event handler): ddprun's events go to --events_file",
     [](const std::string& v, Settings& s) { s.event_log_handler = v; }},
  };
}

// Metrics and the actions.
std::vector<OptionSpec> general_options() {
  return {
    {"metrics_port", "", kGeneral, K::value, "",
     "serve /metrics (Prometheus), /healthz and /readyz on this port (0: a free one, printed; empty: off)",
     [](const std::string& v, Settings& s) {
       if (v.empty()) return;
       auto n = parse_int(v, 0, 65535);
       if (!n) usage("--metrics_port must be a port number 0-65535 (got '" + v + "')");
       s.metrics_port = static_cast<int>(*n);
     }},
    {"metrics_addr", "", kGeneral, K::value, "", "address the metrics server binds (empty: every interface)",
     [](const std::string& v, Settings& s) {
       if (!v.empty() && !is_ip_literal(v)) usage("--metrics_addr must be an IP address such as 0.0.0.0 or ::1 (got '" + v + "')");
       s.metrics_addr = v;
     }},
    {"help", "h", kGeneral, K::action, "", "show this help and exit", nullptr},
    {"version", "", kGeneral, K::action, "", "show the version and the optional parts of this build, and exit", nullptr},
    {"completion", "", kGeneral, K::value, "", "print the completion script for SHELL (bash) and exit", nullptr},
  };
}

}  // namespace

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = [] {
    std::vector<OptionSpec> all;
    for (auto part : {worker_options, rendezvous_options, failure_options, program_options, output_options, general_options}) {
      auto specs = part();
      all.insert(all.end(), specs.begin(), specs.end());
    }
    return all;
  }();
  return table;
}

std::string normalize_option(const std::string& arg) {
  if (arg.size() < 3 || arg.rfind("--", 0) != 0) return arg;
  auto eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  for (std::size_t i = 2; i < name.size(); ++i) {
    if (name[i] == '-') name[i] = '_';
  }
  return eq == std::string::npos ? name : name + arg.substr(eq);
}

std::string pet_name(const std::string& option) {
  std::string upper = "PET_" + option;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper;
}

std::string get_env(const std::map<std::string, std::string>& env, const std::string& k, const std::string& def) {
  auto it = env.find(k);
  return it == env.end() ? def : it->second;
}

bool truthy(const std::string& v) { return v == "1" || v == "true" || v == "True" || v == "TRUE" || v == "yes"; }

}  // namespace ddprun::launcher
