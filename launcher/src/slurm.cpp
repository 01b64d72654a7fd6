#include "slurm.hpp"

#include <cctype>
#include <initializer_list>
#include <utility>

#include "ddprun/common/error.hpp"

namespace ddprun::launcher {
namespace {

[[noreturn]] void bad(const std::string& list, const std::string& why) {
  throw UsageError("'" + (list.size() > 200 ? list.substr(0, 200) + "..." : list) + "' is not a Slurm host list (" +
                   why + ")");
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// "01-04,07" -> 01 02 03 04 07 (zero padding as written in the lower bound).
std::vector<std::string> expand_ranges(const std::string& list, const std::string& ranges, std::size_t limit) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= ranges.size()) {
    auto comma = ranges.find(',', start);
    std::string r = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto dash = r.find('-');
    std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) bad(list, "'[" + ranges + "]' must hold numbers or ranges N-M");
    long long a = std::stoll(lo), b = std::stoll(hi);
    if (a > b) bad(list, "range " + r + " runs backwards");
    if (static_cast<unsigned long long>(b - a) >= limit || out.size() + static_cast<std::size_t>(b - a) >= limit) {
      bad(list, "more than " + std::to_string(limit) + " hosts");
    }
    std::size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
    for (long long v = a; v <= b; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(s);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// One name, possibly with several bracket groups: their expansions multiply.
void expand_item(const std::string& list, const std::string& item, std::vector<std::string>& out, std::size_t limit) {
  std::vector<std::string> names = {""};
  std::size_t i = 0;
  while (i < item.size()) {
    if (item[i] == '[') {
      auto close = item.find(']', i);
      if (close == std::string::npos) bad(list, "'[' without ']'");
      auto values = expand_ranges(list, item.substr(i + 1, close - i - 1), limit);
      std::vector<std::string> next;
      if (names.size() * values.size() > limit) bad(list, "more than " + std::to_string(limit) + " hosts");
      for (const auto& n : names) {
        for (const auto& v : values) next.push_back(n + v);
      }
      names = std::move(next);
      i = close + 1;
    } else if (item[i] == ']') {
      bad(list, "']' without '['");
    } else {
      for (auto& n : names) n += item[i];
      ++i;
    }
  }
  if (out.size() + names.size() > limit) bad(list, "more than " + std::to_string(limit) + " hosts");
  out.insert(out.end(), names.begin(), names.end());
}

// The first of `names` set (not empty) in `env`: its name and value; empty when none is.
std::pair<std::string, std::string> first_set(const std::map<std::string, std::string>& env,
                                              std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = env.find(n);
    if (it != env.end() && !it->second.empty()) return {n, it->second};
  }
  return {};
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, std::size_t limit) {
  std::vector<std::string> out;
  std::string item;
  int depth = 0;
  for (char c : list) {
    if (std::isspace(static_cast<unsigned char>(c))) bad(list, "white space");
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) bad(list, "unbalanced or nested brackets");
    if (c == ',' && depth == 0) {
      if (item.empty()) bad(list, "an empty name");
      expand_item(list, item, out, limit);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) bad(list, "'[' without ']'");
  if (item.empty()) bad(list, "an empty name");
  expand_item(list, item, out, limit);
  return out;
}

std::optional<SlurmStep> slurm_step(const std::map<std::string, std::string>& env) {
  // srun sets the step's own count and list beside the allocation's (a step may hold some of the
  // job's nodes, and several steps may run at once); SLURM_NODEID counts within the step.
  auto [job_var, job] = first_set(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  const auto [nnodes_var, nnodes] = first_set(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  const auto [nodeid_var, nodeid] = first_set(env, {"SLURM_NODEID"});
  const auto [list_var, list] = first_set(env, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
  if (job.empty() || nnodes.empty() || nodeid.empty() || list.empty()) return std::nullopt;
  SlurmStep step;
  auto set = [&](const char* option, const std::string& value, const std::string& var) {
    step.values[option] = value;
    step.from[option] = var;
  };
  if (!all_digits(nnodes) || !all_digits(nodeid)) {
    step.problems["nnodes"] = step.problems["node_rank"] =
        "inside Slurm, " + nnodes_var + "='" + nnodes + "' and SLURM_NODEID='" + nodeid + "' must be numbers";
  } else {
    set("nnodes", nnodes, nnodes_var);
    set("node_rank", nodeid, nodeid_var);
    if (std::stoll(nodeid) >= std::stoll(nnodes)) {
      step.problems["node_rank"] = "inside Slurm, SLURM_NODEID=" + nodeid + " is not below " + nnodes_var + "=" + nnodes +
                                   ": Slurm's variables disagree";
    }
  }
  try {
    const auto hosts = expand_hostlist(list);
    set("master_addr", hosts.front(), list_var);
    set("rdzv_endpoint", hosts.front(), list_var);  // c10d: the first host serves the rendezvous (port 29400)
    if (all_digits(nnodes) && hosts.size() != std::stoull(nnodes)) {
      // (the allocation's list beside a step's count: its first host may not be in the step)
      const std::string why = "inside Slurm, " + list_var + " names " + std::to_string(hosts.size()) + " host" +
                              (hosts.size() == 1 ? "" : "s") + " but " + nnodes_var + "=" + nnodes +
                              ": which node is the first of this step is unknown";
      for (const char* o : {"nnodes", "master_addr", "rdzv_endpoint"}) step.problems[o] = why;
    }
  } catch (const UsageError& e) {
    step.problems["master_addr"] = step.problems["rdzv_endpoint"] = "inside Slurm, " + list_var + ": " + e.what();
  }
  // A requeued job keeps its id and counts SLURM_RESTART_COUNT, and each step of a job (two may
  // run at once, on other nodes) has a number: each run and step gets a run id of its own, so
  // that it does not meet another's nodes, or what an earlier one left in an external store or
  // etcd.
  const auto [restarts_var, restarts] = first_set(env, {"SLURM_RESTART_COUNT"});
  if (!restarts.empty() && restarts != "0") job += "-r" + restarts;
  const auto [step_var, step_id] = first_set(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  if (all_digits(step_id)) job += "-s" + step_id;
  std::string run_id;
  for (char c : job) run_id += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_';
  set("rdzv_id", run_id.substr(0, 128), job_var);
  return step;
}

}  // namespace ddprun::launcher
