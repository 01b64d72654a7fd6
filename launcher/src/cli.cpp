#include "ddprun/launcher/cli.hpp"

#include <unistd.h>

#include <boost/program_options.hpp>
#include <list>
#include <random>
#include <sstream>
#include <sys/stat.h>

#include "ddprun/agent/resources.hpp"
#include "ddprun/agent/spawn.hpp"
#include "ddprun/build_info.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/auth.hpp"
#include "options.hpp"
#include "rdzv_flags.hpp"
#include "slurm.hpp"

namespace ddprun::launcher {
namespace {

namespace po = boost::program_options;

// The option descriptions, generated from the table: value options take a string (parsed by the
// table's parser once the flag, PET_ and Slurm precedence is applied), flags are switches.
po::options_description describe_options() {
  po::options_description all("ddprun options");
  std::list<std::pair<std::string, po::options_description>> groups;  // in the table's order
  for (const auto& o : option_table()) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == o.group; });
    if (g == groups.end()) {
      groups.emplace_back(std::piecewise_construct, std::forward_as_tuple(o.group), std::forward_as_tuple(o.group));
      g = std::prev(groups.end());
    }
    std::string names = std::string(o.name) + (*o.short_name ? std::string(",") + o.short_name : "");
    if (o.kind == OptionKind::flag) {
      g->second.add_options()(names.c_str(), po::bool_switch(), o.help);
    } else if (o.kind == OptionKind::action) {
      g->second.add_options()(names.c_str(), o.help);
    } else if (o.parse == nullptr) {
      g->second.add_options()(names.c_str(), po::value<std::string>(), o.help);
    } else {
      g->second.add_options()(names.c_str(), po::value<std::string>()->default_value(o.default_value), o.help);
    }
  }
  for (auto& [name, g] : groups) all.add(g);
  return all;
}

// Splits the arguments at the training program: everything before is ddprun's, the program and
// everything after belong to the worker (like argparse's REMAINDER).
void split_args(const std::vector<std::string>& args, const po::options_description& desc,
                std::vector<std::string>& ours, std::vector<std::string>& program) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string a = normalize_option(args[i]);
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

namespace {

std::string help_text(const po::options_description& desc) {
  std::ostringstream os;
  os << "Usage: ddprun [options] TRAINING_SCRIPT [ARGS...]\n"
        "Launches one worker per local rank with torchrun's environment, e.g.\n"
        "  ddprun --standalone --nproc_per_node=4 train.py --epochs 3\n"
        "  ddprun --nproc_per_node=8 ./train\n"
        "Every option also reads PET_<NAME> from the environment (e.g. PET_NPROC_PER_NODE=4);\n"
        "both spellings work (--nproc_per_node, --nproc-per-node).\n\n"
     << desc;
  return os.str();
}

// A PET_ switch as the operators set it: 1 or true, 0 or false, and nothing else (a typo must
// not turn a switch silently off or on). PyTorchJob's elasticPolicy.standalone sets
// PET_STANDALONE to the empty string: that one switch is on when set and empty.
bool pet_flag(const std::string& name, const std::string& v) {
  const std::string b = lower(v);
  if ((v.empty() && name == "PET_STANDALONE") || b == "1" || b == "true") return true;
  if (b == "0" || b == "false") return false;
  usage(name + "='" + v + "' is not a switch value: use 1 or true, 0 or false");
}

// Each option's value: an explicit flag wins, then PET_<NAME>, then (inside a Slurm step) what
// Slurm implies, then the default. Every value is checked by the table's parser.
Settings resolve(const po::variables_map& vm, const std::map<std::string, std::string>& env,
                 const std::optional<std::map<std::string, std::string>>& slurm,
                 std::map<std::string, std::string>& derived) {
  Settings s;
  for (const auto& o : option_table()) {
    if (o.kind == OptionKind::action || o.parse == nullptr) continue;
    const auto& v = vm[o.name];
    auto pet = env.find(pet_name(o.name));
    std::string value;
    if (o.kind == OptionKind::flag) {
      value = v.as<bool>() || (pet != env.end() && pet_flag(pet->first, pet->second)) ? "1" : "0";
    } else if (!v.defaulted()) {
      value = v.as<std::string>();
    } else if (pet != env.end()) {
      value = pet->second;
    } else if (slurm && slurm->count(o.name)) {
      value = derived[o.name] = slurm->at(o.name);
    } else {
      value = o.default_value;
    }
    o.parse(value, s);
  }
  return s;
}

int resolve_nproc(const std::string& v, const HostInfo& host) {
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
  auto n = parse_int(v, 1, 100'000);
  if (!n) usage("--nproc_per_node must be a positive integer, 'cpu', 'gpu' or 'auto' (got '" + v + "')");
  return static_cast<int>(*n);
}

void to_agent_options(const Settings& s, const std::map<std::string, std::string>& env, const HostInfo& host,
                      agent::AgentOptions& a) {
  a.nproc_per_node = resolve_nproc(s.nproc_per_node, host);
  a.max_restarts = s.max_restarts;
  a.role = s.role;
  a.worker_timeout = s.worker_timeout;
  a.worker_start_timeout = s.worker_start_timeout;
  if (!s.no_progress_hook) a.python_site_dir = agent::python_site_dir();
  a.stop_timeout = s.stop_timeout;
  // torchrun 2.x's spelling (or its environment variable) wins over --stop_timeout.
  if (s.shutdown_timeout) {
    a.stop_timeout = *s.shutdown_timeout;
  } else if (auto t = get_env(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", ""); !t.empty()) {
    a.stop_timeout = parse_seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", t, false);
  }
  a.max_same_failures = s.max_same_failures;
  a.virtual_local_rank = s.virtual_local_rank;
  a.duplicate_stdout_filters = s.duplicate_stdout_filters;
  a.duplicate_stderr_filters = s.duplicate_stderr_filters;
  a.metrics.addr = s.metrics_addr;
  a.metrics.port = s.metrics_port;
  a.stack_dump_timeout = s.stack_dump_timeout;
  a.numa_binding = s.numa_binding;
  a.report_bindings = s.report_bindings;
  if (a.report_bindings && a.numa_binding.empty()) usage("--report_bindings needs --numa_binding");
  a.forward_signals = s.signals;
  a.redirects = s.redirects;
  a.tee = s.tee;
  a.log_dir = s.log_dir;
  a.events_file = s.events_file.empty() ? get_env(env, "DDPRUN_EVENTS_FILE", "") : s.events_file;
  for (const auto& item : split(s.local_ranks_filter, ',')) {
    if (trim(item).empty()) continue;
    auto n = parse_int(trim(item), 0, a.nproc_per_node - 1);
    if (!n) {
      usage("--local_ranks_filter: '" + item + "' is not a local rank (0.." + std::to_string(a.nproc_per_node - 1) + ")");
    }
    a.local_ranks_filter.insert(static_cast<int>(*n));
  }
  place_store(s, env, a);
}

}  // namespace

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
  if (vm.count("help") || vm.count("version") || vm.count("completion")) {
    r.exit_now = true;
    if (vm.count("help")) {
      r.text = help_text(desc);
    } else if (vm.count("version")) {
      r.text = version_string() + "\n";
    } else {
      const auto& shell = vm["completion"].as<std::string>();
      if (shell != "bash") usage("--completion: only bash is supported (got '" + shell + "')");
      r.text = bash_completion();
    }
    return r;
  }
  // Inside a Slurm step, the settings it implies stand in for defaults (not with --standalone:
  // one node, whatever Slurm says).
  auto slurm = slurm_defaults(env);
  auto pet_standalone = env.find("PET_STANDALONE");
  bool standalone = vm["standalone"].as<bool>() || (pet_standalone != env.end() && pet_flag(pet_standalone->first, pet_standalone->second));
  if (standalone) slurm.reset();
  std::map<std::string, std::string> derived;
  Settings s = resolve(vm, env, slurm, derived);
  r.log_level = s.log_level;
  to_agent_options(s, env, host, r.agent);
  if (!derived.empty()) {
    std::string said;
    for (const auto& [k, v] : derived) said += " --" + k + "=" + v;
    r.notes.push_back("ddprun: inside Slurm job " + get_env(env, "SLURM_JOB_ID", get_env(env, "SLURM_JOBID", "?")) +
                      ":" + said + " (from SLURM_*; explicit flags and PET_ variables win)");
  }
  if (!s.no_progress_hook && r.agent.python_site_dir.empty() && s.worker_timeout.count() > 0) {
    r.notes.push_back("ddprun: no progress hook for Python workers (share/ddprun/python/sitecustomize.py is not "
                      "installed beside ddprun): they must touch DDPRUN_HEARTBEAT_FILE themselves");
  }
  r.agent.command = resolve_command(program, s.module, s.no_python, env);
  r.agent.base_env = env;
  if (!s.log_line_prefix_template.empty()) {
    r.agent.line_prefix_template = s.log_line_prefix_template;
  } else if (auto it = env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); it != env.end()) {
    r.agent.line_prefix_template = it->second;
  }
  return r;
}

}  // namespace ddprun::launcher
