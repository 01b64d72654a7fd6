#include "ddprun/launcher/cli.hpp"

#include <unistd.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <charconv>
#include <optional>
#include <set>
#include <random>
#include <sstream>
#include <sys/stat.h>

#include "ddprun/agent/exit_status.hpp"
#include "ddprun/build_info.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/auth.hpp"
#include "ddprun/agent/spawn.hpp"
#include "slurm.hpp"

namespace ddprun::launcher {
namespace {

namespace po = boost::program_options;

const std::set<int> kAllowedSignals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

[[noreturn]] void usage(const std::string& what) { throw UsageError(what); }

std::optional<long long> to_int(const std::string& s) {
  long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<double> to_double(const std::string& s) {
  try {
    std::size_t used = 0;
    double v = std::stod(s, &used);
    if (used != s.size()) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

po::options_description describe_options() {
  po::options_description all("ddprun options");
  po::options_description workers("Worker group");
  workers.add_options()
      ("nproc_per_node", po::value<std::string>()->default_value("1"),
       "workers on this node: a number, 'cpu' (one per CPU), 'gpu' (one per GPU) or 'auto' (GPUs, else CPUs)")
      ("nnodes", po::value<std::string>()->default_value("1:1"), "number of nodes, N or MIN:MAX")
      ("node_rank", po::value<std::string>()->default_value("0"), "rank of this node (static rendezvous)")
      ("role", po::value<std::string>()->default_value("default"), "role name of the workers (ROLE_NAME)")
      ("max_restarts", po::value<std::string>()->default_value("0"), "restarts of the worker group before giving up");
  po::options_description rdzv("Rendezvous");
  rdzv.add_options()
      ("standalone", po::bool_switch(), "single node: the store on 127.0.0.1, a free port, a random run id")
      ("master_addr", po::value<std::string>()->default_value("127.0.0.1"), "address of the store (static rendezvous)")
      ("master_port", po::value<std::string>()->default_value("29500"), "port of the store (static rendezvous)")
      ("rdzv_backend", po::value<std::string>()->default_value("static"), "static or c10d")
      ("rdzv_endpoint", po::value<std::string>()->default_value(""), "host[:port] of the rendezvous store (c10d)")
      ("rdzv_id", po::value<std::string>()->default_value("none"), "job id shared by all nodes (TORCHELASTIC_RUN_ID)")
      ("rdzv_conf", po::value<std::string>()->default_value(""), "key=value,... rendezvous settings")
      ("local_addr", po::value<std::string>()->default_value(""), "this node's address as other nodes see it");
  po::options_description fault("Failures and hangs");
  fault.add_options()
      ("worker_timeout", po::value<std::string>()->default_value("0"),
       "seconds without a touch of DDPRUN_HEARTBEAT_FILE after which a worker counts as hung (0 = off)")
      ("stop_timeout", po::value<std::string>()->default_value("5"), "seconds between SIGTERM and SIGKILL when stopping workers")
      ("signals_to_handle", po::value<std::string>()->default_value("SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
       "signals forwarded to the workers (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2)")
      ("monitor_interval", po::value<std::string>()->default_value("0.1"),
       "accepted for torchrun compatibility; ddprun sees worker exits as they happen");
  po::options_description program("Program");
  program.add_options()
      ("module,m", po::bool_switch(), "run the program as a Python module (python -m)")
      ("no_python", po::bool_switch(), "execute the program directly, not through Python")
      ("run_path", po::bool_switch(), "accepted for compatibility: runs the script with Python like the default")
      ("start_method", po::value<std::string>()->default_value("spawn"), "accepted for compatibility (spawn, fork, forkserver)");
  po::options_description output("Output and logs");
  output.add_options()
      ("log_dir", po::value<std::string>()->default_value(""), "per-rank logs: LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK/{stdout,stderr}.log")
      ("redirects,r", po::value<std::string>()->default_value("0"),
       "streams to files only: 0 none, 1 stdout, 2 stderr, 3 both; per rank as 0:1,1:2")
      ("tee,t", po::value<std::string>()->default_value("0"), "streams to files and the console, values as --redirects")
      ("local_ranks_filter", po::value<std::string>()->default_value(""), "local ranks shown on the console, e.g. 0 or 0,2")
      ("log_level", po::value<std::string>()->default_value("info"), "ddprun's own messages: debug, info, warn, error")
      ("events_file", po::value<std::string>()->default_value(""),
       "append machine-readable events (JSON Lines) to this file; also DDPRUN_EVENTS_FILE");
  po::options_description general("General");
  general.add_options()
      ("help,h", "show this help and exit")
      ("version", "show the version and the optional parts of this build, and exit")
      ("completion", po::value<std::string>(), "print the completion script for SHELL (bash) and exit");
  all.add(workers).add(rdzv).add(fault).add(program).add(output).add(general);
  return all;
}

// "--nproc-per-node" -> "--nproc_per_node" (torchrun accepts both spellings).
std::string normalize(const std::string& arg) {
  if (arg.size() < 3 || arg.rfind("--", 0) != 0) return arg;
  auto eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  for (std::size_t i = 2; i < name.size(); ++i) {
    if (name[i] == '-') name[i] = '_';
  }
  return eq == std::string::npos ? name : name + arg.substr(eq);
}

// Splits the arguments at the training program: everything before is ddprun's, the program and
// everything after belong to the worker (like argparse's REMAINDER).
void split_args(const std::vector<std::string>& args, const po::options_description& desc,
                std::vector<std::string>& ours, std::vector<std::string>& program) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string a = normalize(args[i]);
    if (a == "--") {
      program.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      return;
    }
    if (a.size() < 2 || a[0] != '-') {
      program.assign(args.begin() + static_cast<long>(i), args.end());
      return;
    }
    bool long_opt = a.rfind("--", 0) == 0;
    std::string name = long_opt ? a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2)
                                : a.substr(0, 2);  // Program_options names short options "-m"
    const po::option_description* d = desc.find_nothrow(name, false, false, false);
    if (!d) {
      usage("unknown option '" + args[i] + "'");
    }
    ours.push_back(a);
    bool takes_value = d->semantic()->max_tokens() > 0;
    bool inline_value = long_opt ? a.find('=') != std::string::npos : a.size() > 2;
    if (takes_value && !inline_value) {
      if (i + 1 >= args.size()) usage("option '" + args[i] + "' needs a value");
      ours.push_back(args[++i]);
    }
  }
}

int parse_positive(const std::string& flag, const std::string& v, bool allow_zero = false) {
  auto n = to_int(v);
  if (!n || *n < (allow_zero ? 0 : 1) || *n > 1'000'000) {
    usage("--" + flag + " must be " + (allow_zero ? "a non-negative" : "a positive") + " integer (got '" + v + "')");
  }
  return static_cast<int>(*n);
}

int parse_nproc(const std::string& v, const HostInfo& host) {
  if (v == "cpu") return host.cpus;
  if (v == "gpu") {
    int g = host.count_gpus();
    if (g == 0) usage("--nproc_per_node=gpu: no GPU found on this machine (use a number, or 'cpu')");
    return g;
  }
  if (v == "auto") {
    int g = host.count_gpus();
    return g > 0 ? g : host.cpus;
  }
  auto n = to_int(v);
  if (!n || *n < 1 || *n > 100'000) {
    usage("--nproc_per_node must be a positive integer, 'cpu', 'gpu' or 'auto' (got '" + v + "')");
  }
  return static_cast<int>(*n);
}

void parse_nnodes(const std::string& v, int& min_nodes, int& max_nodes) {
  auto parts = split(v, ':');
  if (parts.size() == 1 && v.find(':') == std::string::npos) {
    min_nodes = max_nodes = parse_positive("nnodes", v);
    return;
  }
  if (parts.size() != 2) usage("--nnodes must be N or MIN:MAX (got '" + v + "')");
  auto lo = to_int(parts[0]), hi = to_int(parts[1]);
  if (!lo || !hi || *lo < 1 || *hi < 1) usage("--nnodes must be N or MIN:MAX with positive numbers (got '" + v + "')");
  if (*lo > *hi) usage("--nnodes=" + v + ": MIN is larger than MAX");
  min_nodes = static_cast<int>(*lo);
  max_nodes = static_cast<int>(*hi);
}

std::uint16_t parse_port(const std::string& flag, const std::string& v) {
  auto n = to_int(v);
  if (!n || *n < 0 || *n > 65535) usage("--" + flag + " must be a port number 0-65535 (got '" + v + "')");
  return static_cast<std::uint16_t>(*n);
}

// "host", "host:port", "[v6]:port", "[v6]".
std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& v, std::uint16_t default_port) {
  auto bad = [&](const std::string& why) -> std::pair<std::string, std::uint16_t> {
    usage("--rdzv_endpoint='" + v + "' is malformed: " + why + " (expected HOST[:PORT], e.g. node0:29400 or [::1]:29400)");
  };
  if (v.empty()) return bad("empty");
  std::string host, port;
  if (v[0] == '[') {
    auto close = v.find(']');
    if (close == std::string::npos) return bad("missing ']'");
    host = v.substr(1, close - 1);
    std::string rest = v.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return bad("unexpected text after ']'");
      port = rest.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    auto colon = v.rfind(':');
    if (colon != std::string::npos && v.find(':') != colon) return bad("IPv6 addresses need brackets");
    host = colon == std::string::npos ? v : v.substr(0, colon);
    if (colon != std::string::npos) {
      port = v.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (host.empty()) return bad("empty host");
  for (char c : host) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == ',') return bad("invalid character in host");
  }
  if (port.empty()) return {host, default_port};
  auto n = to_int(port);
  if (!n || *n < 0 || *n > 65535) return bad("port must be 0-65535");
  return {host, static_cast<std::uint16_t>(*n)};
}

agent::StreamSelection parse_streams(const std::string& flag, const std::string& v) {
  agent::StreamSelection s;
  auto value = [&](const std::string& x) {
    auto n = to_int(trim(x));
    if (!n || *n < 0 || *n > 3) usage("--" + flag + " values are 0 (none), 1 (stdout), 2 (stderr) or 3 (both) (got '" + v + "')");
    return static_cast<int>(*n);
  };
  if (v.find(':') == std::string::npos) {
    s.all = value(v);
    return s;
  }
  for (const auto& item : split(v, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) usage("--" + flag + " per-rank form is RANK:VALUE,... (got '" + v + "')");
    auto rank = to_int(trim(item.substr(0, colon)));
    if (!rank || *rank < 0) usage("--" + flag + ": bad local rank in '" + item + "'");
    s.per_rank[static_cast<int>(*rank)] = value(item.substr(colon + 1));
  }
  return s;
}

std::set<int> parse_signals(const std::string& v) {
  std::set<int> out = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  for (const auto& raw : split(v, ',')) {
    std::string name = trim(raw);
    if (name.empty()) continue;
    int s = agent::parse_signal(name);
    if (!s || !kAllowedSignals.count(s)) {
      usage("--signals_to_handle: '" + name + "' is not one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2");
    }
    out.insert(s);
  }
  return out;
}

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& v, bool allow_zero) {
  auto d = to_double(v);
  if (!d || *d < 0 || (!allow_zero && *d == 0) || *d > 1e7) {
    usage("--" + flag + " must be a " + std::string(allow_zero ? "non-negative" : "positive") + " number of seconds (got '" + v + "')");
  }
  return std::chrono::milliseconds(static_cast<long long>(*d * 1000.0 + 0.5));
}

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<unsigned> d(0, 15);
  std::string id;
  for (int i = 0; i < 12; ++i) id += "0123456789abcdef"[d(rd)];
  return id;
}

std::string get_env(const std::map<std::string, std::string>& env, const std::string& k, const std::string& def) {
  auto it = env.find(k);
  return it == env.end() ? def : it->second;
}

// The worker command: python for .py scripts and -m, the program itself otherwise.
std::vector<std::string> resolve_command(const std::vector<std::string>& program, bool module, bool no_python,
                                         const std::map<std::string, std::string>& env) {
  if (program.empty() || program[0].empty()) {
    usage("no training program given. Usage: ddprun [options] TRAINING_SCRIPT [ARGS...] (see ddprun --help)");
  }
  if (module && no_python) usage("-m and --no_python cannot be used together");
  const std::string path_env = get_env(env, "PATH", "/usr/local/bin:/usr/bin:/bin");
  const std::string& script = program[0];
  std::vector<std::string> args(program.begin() + 1, program.end());
  auto python = [&]() {
    std::string exe = get_env(env, "PYTHON_EXEC", "python3");
    std::string path = agent::find_executable(exe, path_env);
    if (path.empty()) usage("Python interpreter '" + exe + "' not found; install it or set PYTHON_EXEC");
    return path;
  };
  auto is_file = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  };
  std::vector<std::string> cmd;
  if (module) {
    cmd = {python(), "-u", "-m", script};
  } else if (!no_python && script.size() > 3 && script.substr(script.size() - 3) == ".py") {
    if (!is_file(script)) usage("training script '" + script + "' not found");
    cmd = {python(), "-u", script};
  } else {
    std::string path = agent::find_executable(script, path_env);
    if (path.empty()) {
      if (is_file(script) || is_file("./" + script)) {
        usage("'" + script + "' is not executable: chmod +x it, or name a .py script to run it with Python");
      }
      usage("training program '" + script + "' not found (not a file, and not in PATH)");
    }
    cmd = {path};
  }
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

}  // namespace

std::string version_string() {
  auto on = [](int f) { return f ? "on" : "off"; };
  return std::string("ddprun ") + DDPRUN_VERSION + "\nbuilt with: nccl " + on(DDPRUN_FEATURE_NCCL) + ", etcd " +
         on(DDPRUN_FEATURE_ETCD) + ", hwloc " + on(DDPRUN_FEATURE_HWLOC);
}

// A bash completion script generated from the option table itself, so it offers exactly the
// options ddprun accepts (both spellings), and files once the training program has started.
std::string bash_completion() {
  auto desc = describe_options();
  std::string all, all_dashed, with_value;
  for (const auto& o : desc.options()) {
    std::string name = o->long_name();
    if (name.empty() || name == "completion") continue;
    std::string dashed = name;
    for (auto& c : dashed) c = c == '_' ? '-' : c;
    all += " --" + name;
    all_dashed += " --" + dashed;
    if (o->semantic()->max_tokens() > 0) with_value += "|--" + name + (dashed != name ? "|--" + dashed : "");
  }
  std::string shorts;
  for (const auto& o : desc.options()) {
    auto f = o->canonical_display_name(po::command_line_style::allow_dash_for_short);
    if (f.size() == 2 && f[0] == '-' && o->semantic()->max_tokens() > 0) shorts += "|" + f;
  }
  std::string takes = with_value.substr(1) + shorts;
  return "# bash completion for ddprun (generated by: ddprun --completion bash)\n"
         "_ddprun() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} i w\n"
         "  # Once the training program is named, its own arguments follow: complete files.\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
         "    w=${COMP_WORDS[i]}\n"
         "    case $w in\n"
         "      --) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
         "      " + takes + ") ((i++)) ;;\n"
         "      -*) ;;\n"
         "      *) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
         "    esac\n"
         "  done\n"
         "  case $prev in\n"
         "    --nproc_per_node|--nproc-per-node) COMPREPLY=($(compgen -W \"1 2 4 8 cpu gpu auto\" -- \"$cur\")); return ;;\n"
         "    --rdzv_backend|--rdzv-backend) COMPREPLY=($(compgen -W \"static c10d\" -- \"$cur\")); return ;;\n"
         "    --log_level|--log-level) COMPREPLY=($(compgen -W \"debug info warn error\" -- \"$cur\")); return ;;\n"
         "    --redirects|--tee|-r|-t) COMPREPLY=($(compgen -W \"0 1 2 3\" -- \"$cur\")); return ;;\n"
         "    --log_dir|--log-dir) COMPREPLY=($(compgen -d -- \"$cur\")); return ;;\n"
         "    " + takes + ") COMPREPLY=(); return ;;\n"
         "  esac\n"
         "  # One spelling: torchrun's underscores, or hyphens once the word has one after '--'.\n"
         "  if [[ $cur == --*-* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"" + all_dashed.substr(1) + "\" -- \"$cur\"))\n"
         "  elif [[ $cur == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"" + all.substr(1) + "\" -- \"$cur\"))\n"
         "  else\n"
         "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  fi\n"
         "}\n"
         "complete -o filenames -o bashdefault -F _ddprun ddprun\n";
}

CliResult parse_command_line(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                             const HostInfo& host) {
  auto desc = describe_options();
  std::vector<std::string> ours, program;
  split_args(args, desc, ours, program);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(ours).options(desc).style(po::command_line_style::unix_style).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    usage(e.what());
  }
  CliResult r;
  if (vm.count("help")) {
    std::ostringstream os;
    os << "Usage: ddprun [options] TRAINING_SCRIPT [ARGS...]\n"
          "Launches one worker per local rank with torchrun's environment, e.g.\n"
          "  ddprun --standalone --nproc_per_node=4 train.py --epochs 3\n"
          "  ddprun --nproc_per_node=8 ./train\n"
          "Every option also reads PET_<NAME> from the environment (e.g. PET_NPROC_PER_NODE=4);\n"
          "both spellings work (--nproc_per_node, --nproc-per-node).\n\n"
       << desc;
    r.exit_now = true;
    r.text = os.str();
    return r;
  }
  if (vm.count("version")) {
    r.exit_now = true;
    r.text = version_string() + "\n";
    return r;
  }
  if (vm.count("completion")) {
    if (vm["completion"].as<std::string>() != "bash") {
      usage("--completion: only bash is supported (got '" + vm["completion"].as<std::string>() + "')");
    }
    r.exit_now = true;
    r.text = bash_completion();
    return r;
  }
  // An explicit flag wins; else PET_<NAME>; else the default.
  // Inside a Slurm step, the settings it implies stand in for defaults: an explicit flag wins,
  // then PET_<NAME>, then Slurm, then the default.
  auto slurm = slurm_defaults(env);
  if (vm["standalone"].as<bool>()) slurm.reset();  // one node, whatever Slurm says
  std::map<std::string, std::string> derived;
  auto get = [&](const std::string& name) -> std::string {
    const auto& v = vm[name];
    if (!v.defaulted()) return v.as<std::string>();
    std::string upper = name;
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    auto it = env.find("PET_" + upper);
    if (it != env.end()) return it->second;
    if (slurm && slurm->count(name)) {
      derived[name] = slurm->at(name);
      return slurm->at(name);
    }
    return v.as<std::string>();
  };
  auto flag = [&](const std::string& name) -> bool {
    if (vm[name].as<bool>()) return true;
    std::string upper = name;
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    auto v = get_env(env, "PET_" + upper, "");
    return v == "1" || v == "true" || v == "True" || v == "TRUE" || v == "yes";
  };

  auto& a = r.agent;
  a.nproc_per_node = parse_nproc(get("nproc_per_node"), host);
  int min_nodes = 1, max_nodes = 1;
  parse_nnodes(get("nnodes"), min_nodes, max_nodes);
  a.node_rank = parse_positive("node_rank", get("node_rank"), true);
  a.max_restarts = parse_positive("max_restarts", get("max_restarts"), true);
  a.role = get("role");
  if (a.role.empty()) usage("--role must not be empty");
  a.worker_timeout = parse_seconds("worker_timeout", get("worker_timeout"), true);
  a.stop_timeout = parse_seconds("stop_timeout", get("stop_timeout"), false);
  parse_seconds("monitor_interval", get("monitor_interval"), true);  // validated, not needed
  a.forward_signals = parse_signals(get("signals_to_handle"));
  a.redirects = parse_streams("redirects", get("redirects"));
  a.tee = parse_streams("tee", get("tee"));
  a.log_dir = get("log_dir");
  a.events_file = get("events_file");
  if (a.events_file.empty()) a.events_file = get_env(env, "DDPRUN_EVENTS_FILE", "");
  for (const auto& item : split(get("local_ranks_filter"), ',')) {
    if (trim(item).empty()) continue;
    auto n = to_int(trim(item));
    if (!n || *n < 0 || *n >= a.nproc_per_node) {
      usage("--local_ranks_filter: '" + item + "' is not a local rank (0.." + std::to_string(a.nproc_per_node - 1) + ")");
    }
    a.local_ranks_filter.insert(static_cast<int>(*n));
  }
  r.log_level = get("log_level");
  if (r.log_level != "debug" && r.log_level != "info" && r.log_level != "warn" && r.log_level != "error" &&
      r.log_level != "trace" && r.log_level != "off") {
    usage("--log_level must be debug, info, warn or error (got '" + r.log_level + "')");
  }

  std::string backend = get("rdzv_backend");
  if (backend == "etcd" || backend == "etcd-v2") usage("--rdzv_backend=" + backend + " is not supported: use c10d (ddprun's own store)");
  if (backend != "static" && backend != "c10d") {
    usage("--rdzv_backend must be 'static' or 'c10d' (got '" + backend + "')");
  }
  std::string endpoint = get("rdzv_endpoint");
  std::map<std::string, std::string> conf;
  for (const auto& kv : split(get("rdzv_conf"), ',')) {
    if (trim(kv).empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos) usage("--rdzv_conf items are KEY=VALUE (got '" + kv + "')");
    conf[trim(kv.substr(0, eq))] = trim(kv.substr(eq + 1));
  }
  auto master_port = parse_port("master_port", get("master_port"));
  std::string master_addr = get("master_addr");
  if (master_addr.empty()) usage("--master_addr must not be empty");
  a.run_id = get("rdzv_id");
  // The run id names a directory under the log directory: anything that could climb out of it
  // or name something else is refused.
  {
    const std::string& id = a.run_id;
    bool ok = !id.empty() && id.size() <= 128 && id != "." && id != "..";
    for (char c : id) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
    if (!ok) {
      usage("--rdzv_id='" + (id.size() > 140 ? id.substr(0, 140) + "..." : id) +
            "' is not a valid run id: use 1-128 of the characters A-Z a-z 0-9 . _ - (not '.' or '..'), e.g. job-42");
    }
  }
  a.rdzv.local_addr = get("local_addr");
  if (flag("standalone")) {
    if (max_nodes != 1) usage("--standalone runs a single node: drop --nnodes or set it to 1");
    a.store_host = "127.0.0.1";
    a.store_port = 0;  // bound first, then published: no free-port race
    a.run_id = random_run_id();
  } else if (backend == "c10d") {
    auto [h, p] = parse_endpoint(endpoint.empty() ? "127.0.0.1" : endpoint, 29400);
    a.store_host = h;
    a.store_port = p;
  } else {
    if (!endpoint.empty()) parse_endpoint(endpoint, master_port);  // validated; static uses master_addr
    a.store_host = master_addr;
    a.store_port = master_port;
  }
  a.nnodes = max_nodes;
  if (max_nodes == 1) {
    if (a.node_rank != 0) usage("--node_rank=" + std::to_string(a.node_rank) + " needs --nnodes > " + std::to_string(a.node_rank));
    if (!conf.empty() && backend != "c10d") usage("--rdzv_conf applies to --rdzv_backend=c10d");
  } else {
    auto& z = a.rdzv;
    std::string secret_file;
    z.enabled = true;
    z.dynamic = backend == "c10d";
    z.min_nodes = min_nodes;
    z.max_nodes = max_nodes;
    z.endpoint_host = a.store_host;
    z.endpoint_port = a.store_port;
    if (!z.dynamic) {
      if (min_nodes != max_nodes) usage("--nnodes=" + get("nnodes") + ": a range needs --rdzv_backend=c10d (static rendezvous has a fixed number of nodes)");
      if (a.node_rank >= max_nodes) usage("--node_rank=" + std::to_string(a.node_rank) + " must be below --nnodes=" + std::to_string(max_nodes));
      z.is_host = a.node_rank == 0 ? 1 : 0;  // node 0 hosts the store at --master_addr:--master_port
    }
    for (const auto& [k, v] : conf) {
      if (k == "join_timeout" || k == "timeout") z.join_timeout = parse_seconds("rdzv_conf " + k, v, false);
      else if (k == "last_call_timeout") z.last_call_timeout = parse_seconds("rdzv_conf " + k, v, true);
      else if (k == "close_timeout") z.close_timeout = parse_seconds("rdzv_conf " + k, v, true);
      else if (k == "keep_alive_interval") z.keep_alive_interval = parse_seconds("rdzv_conf " + k, v, false);
      else if (k == "read_timeout") z.read_timeout = parse_seconds("rdzv_conf " + k, v, false);
      else if (k == "keep_alive_max_attempt") z.keep_alive_max_attempt = parse_positive("rdzv_conf keep_alive_max_attempt", v);
      else if (k == "is_host") {
        std::string b = v;
        for (auto& c : b) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (b == "1" || b == "true" || b == "yes") z.is_host = 1;
        else if (b == "0" || b == "false" || b == "no") z.is_host = 0;
        else usage("--rdzv_conf is_host must be true or false (got '" + v + "')");
      } else if (k == "secret_file") {
        if (v.empty()) usage("--rdzv_conf secret_file needs a path");
        secret_file = v;
      } else {
        usage("--rdzv_conf: unknown key '" + k + "' (known: join_timeout, last_call_timeout, close_timeout, "
              "keep_alive_interval, keep_alive_max_attempt, read_timeout, is_host, timeout, secret_file)");
      }
    }
    if (secret_file.empty()) {
      if (auto it = env.find("DDPRUN_SECRET_FILE"); it != env.end()) secret_file = it->second;
    }
    if (!secret_file.empty()) z.secret = rendezvous::auth::read_secret_file(secret_file);
  }

  if (!derived.empty()) {
    std::string said;
    for (const auto& [k, v] : derived) said += " --" + k + "=" + v;
    r.notes.push_back("ddprun: inside Slurm job " + get_env(env, "SLURM_JOB_ID", get_env(env, "SLURM_JOBID", "?")) +
                      ":" + said + " (from SLURM_*; explicit flags and PET_ variables win)");
  }
  a.command = resolve_command(program, flag("module"), flag("no_python"), env);
  a.base_env = env;
  if (auto it = env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); it != env.end()) a.line_prefix_template = it->second;
  return r;
}

}  // namespace ddprun::launcher
