#include "slurm.hpp"

#include <cctype>

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

std::string env_or(const std::map<std::string, std::string>& env, const char* k, const char* k2 = nullptr) {
  auto it = env.find(k);
  if (it != env.end() && !it->second.empty()) return it->second;
  if (k2) {
    it = env.find(k2);
    if (it != env.end()) return it->second;
  }
  return "";
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

std::optional<std::map<std::string, std::string>> slurm_defaults(const std::map<std::string, std::string>& env) {
  std::string job = env_or(env, "SLURM_JOB_ID", "SLURM_JOBID");
  std::string nnodes = env_or(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES");
  std::string nodeid = env_or(env, "SLURM_NODEID");
  std::string nodelist = env_or(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST");
  if (job.empty() || nnodes.empty() || nodeid.empty() || nodelist.empty()) return std::nullopt;
  if (!all_digits(nnodes) || !all_digits(nodeid)) {
    throw UsageError("inside Slurm, SLURM_NNODES='" + nnodes + "' and SLURM_NODEID='" + nodeid +
                     "' must be numbers (or give --nnodes and --node_rank)");
  }
  std::vector<std::string> hosts;
  try {
    hosts = expand_hostlist(nodelist);
  } catch (const UsageError& e) {
    throw UsageError(std::string("inside Slurm, SLURM_JOB_NODELIST: ") + e.what() + "; give --master_addr");
  }
  // A requeued job keeps its id and counts SLURM_RESTART_COUNT: each run gets a run id of its
  // own, so that it does not meet what an earlier run left in an external store or etcd.
  std::string restarts = env_or(env, "SLURM_RESTART_COUNT");
  if (!restarts.empty() && restarts != "0") job += "-r" + restarts;
  std::string run_id;
  for (char c : job) run_id += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_';
  return std::map<std::string, std::string>{
      {"nnodes", nnodes},
      {"node_rank", nodeid},
      {"master_addr", hosts.front()},
      {"rdzv_endpoint", hosts.front()},  // c10d: the first host serves the rendezvous (port 29400)
      {"rdzv_id", run_id.substr(0, 128)}};
}

}  // namespace ddprun::launcher
