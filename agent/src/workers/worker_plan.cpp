#include "workers/worker_plan.hpp"

#include <unistd.h>

#include <csignal>
#include <map>

#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/text.hpp"
#include "workers/state_areas.hpp"

namespace ddprun::agent {
namespace {

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

// "SIGTERM,SIGINT,SIGHUP,SIGQUIT", then the others (torchrun's default order and spelling).
std::string signal_list(const std::set<int>& signals) {
  std::string out;
  auto add = [&](int s) { out += (out.empty() ? "" : ",") + signal_name(s); };
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    if (signals.count(s)) add(s);
  }
  for (int s : signals) {
    if (s != SIGTERM && s != SIGINT && s != SIGHUP && s != SIGQUIT) add(s);
  }
  return out;
}

// `dir` first on a colon-separated list (once: a nested ddprun does not add it again).
void prepend_path(std::map<std::string, std::string>& env, const std::string& key, const std::string& dir) {
  auto& v = env[key];
  if (v == dir || v.rfind(dir + ":", 0) == 0) return;
  v = v.empty() ? dir : dir + ":" + v;
}

// What every worker of the group shares: the inherited environment with the group's variables.
std::map<std::string, std::string> group_env(const AgentOptions& opt, const rounds::RoundInfo& r) {
  std::map<std::string, std::string> env = opt.base_env;
  auto set = [&](const std::string& k, const std::string& v) { env[k] = v; };
  set("WORLD_SIZE", std::to_string(r.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(opt.nproc_per_node));
  set("GROUP_RANK", std::to_string(r.group_rank));
  set("GROUP_WORLD_SIZE", std::to_string(r.group_world));
  set("ROLE_NAME", opt.role);
  set("ROLE_WORLD_SIZE", std::to_string(r.world_size));
  set("MASTER_ADDR", r.store_host);
  set("MASTER_PORT", std::to_string(r.store_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(r.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(opt.max_restarts));
  set("TORCHELASTIC_RUN_ID", opt.rdzv.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", signal_list(opt.forward_signals));
  // PyTorch 2.x reads TORCH_NCCL_ASYNC_ERROR_HANDLING and warns on every rank about the 1.x
  // name, NCCL_ASYNC_ERROR_HANDLING, which is all 1.x reads: the old name only where the hook
  // cannot set it for 1.x alone, and never over a choice of the user's.
  const bool user_chose = env.count("NCCL_ASYNC_ERROR_HANDLING") || env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  if (!user_chose) env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  if (!user_chose && !(opt.hook_sees_torch && !opt.python_site_dir.empty())) env["NCCL_ASYNC_ERROR_HANDLING"] = "1";
  if (!opt.python_site_dir.empty()) {
    prepend_path(env, "PYTHONPATH", opt.python_site_dir);
    env["DDPRUN_STACK_SIGNAL"] = std::to_string(stack_signal());  // the hook's faulthandler (README: Hangs)
  }
  env.try_emplace("PYTHONFAULTHANDLER", "1");  // a hung Python worker stopped with SIGABRT prints its stacks
  if (opt.nproc_per_node > 1) env.try_emplace("OMP_NUM_THREADS", "1");
  return env;
}

// The variables one worker sets for itself. `devices`: the inherited CUDA_VISIBLE_DEVICES, split
// (--virtual_local_rank).
std::vector<std::pair<std::string, std::string>> own_vars(const AgentOptions& opt, const std::vector<std::string>& devices,
                                                          const WorkerSpec& w) {
  std::vector<std::pair<std::string, std::string>> own = {
      {"RANK", std::to_string(w.rank)},
      {"LOCAL_RANK", std::to_string(w.local_rank)},
      {"ROLE_RANK", std::to_string(w.rank)},
      {"TORCHELASTIC_ERROR_FILE", w.error_file},
      {"DDPRUN_HEARTBEAT_FILE", w.heartbeat_file}};
  if (opt.virtual_local_rank) {
    // Its own GPU as device 0: the inherited list's entry for this local rank, else its index.
    own.emplace_back("CUDA_VISIBLE_DEVICES", w.local_rank < static_cast<int>(devices.size())
                                                 ? trim(devices[static_cast<std::size_t>(w.local_rank)])
                                                 : std::to_string(w.local_rank));
    own[1].second = "0";  // LOCAL_RANK
  }
  return own;
}

StreamRoute route(const AgentOptions& opt, const WorkerSpec& w, const std::string& dir, int which /*1 out, 2 err*/) {
  StreamRoute r;
  bool redirect = opt.redirects.for_rank(w.local_rank) & which;
  bool tee = opt.tee.for_rank(w.local_rank) & which;
  bool shown = opt.local_ranks_filter.empty() || opt.local_ranks_filter.count(w.local_rank);
  if (!redirect && shown) r.console_fd = which == 1 ? STDOUT_FILENO : STDERR_FILENO;
  if (redirect || tee) r.file = dir + (which == 1 ? "/stdout.log" : "/stderr.log");
  r.keep_tail = which == 2;
  r.duplicate_filters = which == 1 ? opt.duplicate_stdout_filters : opt.duplicate_stderr_filters;
  // One file per attempt, beside the ranks' folders, as torchrun writes it.
  r.duplicate_file = dir.substr(0, dir.rfind('/')) + (which == 1 ? "/filtered_stdout.log" : "/filtered_stderr.log");
  r.prefix = replace_all(replace_all(replace_all(opt.line_prefix_template, "${role_name}", opt.role),
                                     "${local_rank}", std::to_string(w.local_rank)),
                         "${rank}", std::to_string(w.rank));
  return r;
}

}  // namespace

std::vector<WorkerSpec> plan_workers(const AgentOptions& opt, const rounds::RoundInfo& round, const RunDir& dir,
                                     const StateAreas* state) {
  std::vector<WorkerSpec> specs(opt.nproc_per_node);
  const auto dirs = dir.worker_dirs(round.round, opt.nproc_per_node);
  // The group's environment as "K=V", built once for all: without the variables each worker
  // sets for itself (an inherited RANK, say), which each worker's own then add.
  auto group = group_env(opt, round);
  std::vector<std::string> devices;
  auto visible = group.find("CUDA_VISIBLE_DEVICES");
  if (opt.virtual_local_rank && visible != group.end()) devices = split(visible->second, ',');
  for (const auto& kv : own_vars(opt, devices, WorkerSpec{})) group.erase(kv.first);
  std::vector<std::string> shared;
  shared.reserve(group.size());
  group.erase("DDPRUN_STATE_FD");  // a nested ddprun's: not this job's area
  group.erase("DDPRUN_STATE_BYTES");
  if (state && state->ranks() >= opt.nproc_per_node) {
    group["DDPRUN_STATE_FD"] = std::to_string(kStateFd);
    group["DDPRUN_STATE_BYTES"] = std::to_string(state->bytes_per_rank());
  }
  for (const auto& [k, v] : group) shared.push_back(k + "=" + v);
  for (int i = 0; i < opt.nproc_per_node; ++i) {
    auto& w = specs[i];
    w.local_rank = i;
    w.rank = round.rank_offset + i;
    const std::string& wdir = dirs[static_cast<std::size_t>(i)];
    w.dir = wdir;
    w.error_file = wdir + "/error.json";
    w.heartbeat_file = wdir + "/heartbeat";
    for (const auto& a : opt.command) w.argv.push_back(replace_all(a, "${local_rank}", std::to_string(i)));
    w.env = shared;
    for (const auto& [k, v] : own_vars(opt, devices, w)) w.env.push_back(k + "=" + v);
    w.out = route(opt, w, wdir, 1);
    w.err = route(opt, w, wdir, 2);
    if (static_cast<std::size_t>(i) < opt.bindings.size()) w.binding = opt.bindings[static_cast<std::size_t>(i)];
    if (state && state->ranks() >= opt.nproc_per_node) w.state_fd = state->fd(i);
  }
  return specs;
}

}  // namespace ddprun::agent
