// What a warm spare stands in for (spares.hpp): read from a worker's argv and the machine.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>

#include "containment/process_tree.hpp"
#include "workers/spares.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent {
namespace {

// What ddprun sets per rank and per attempt: a spare's may differ from its worker's (it is sent).
const std::set<std::string>& per_attempt() {
  static const std::set<std::string> keys = {
      "RANK", "LOCAL_RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", "DDPRUN_HEARTBEAT_FILE"};
  return keys;
}

std::string file_id(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

// FNV-1a over the file's bytes, with its size: enough to tell an edited script from the same one.
std::string digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unsigned long long h = 1469598103934665603ULL;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return std::to_string(text.size()) + ":" + std::to_string(h);
}

// Flags a spare can be started with as the worker is: single letters that take no value.
bool plain_flags(const std::string& a) {
  if (a.size() < 2 || a[0] != '-' || a[1] == '-') return false;
  return std::all_of(a.begin() + 1, a.end(), [](char c) { return std::string("bBdEiIOqsSuv").find(c) != std::string::npos; });
}

}  // namespace

std::optional<SpareKey> SpareKey::of(const WorkerSpec& spec) {
  const auto& argv = spec.argv;
  if (argv.size() < 2 || !is_python_executable(argv[0])) return std::nullopt;
  SpareKey k;
  k.interpreter.push_back(argv[0]);
  std::size_t i = 1;
  for (; i < argv.size() && argv[i] != "-m" && plain_flags(argv[i]); ++i) k.interpreter.push_back(argv[i]);
  if (i >= argv.size()) return std::nullopt;
  if (argv[i] == "-m") {
    if (i + 1 >= argv.size() || argv[i + 1].empty()) return std::nullopt;
    k.run = "-m " + argv[i + 1];
    i += 2;
  } else {
    if (argv[i].empty() || argv[i][0] == '-') return std::nullopt;  // -c, -W, "-": no spare
    k.run = argv[i];
    i += 1;
  }
  k.args.assign(argv.begin() + static_cast<long>(i), argv.end());
  k.interpreter_id = file_id(argv[0]);
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof(cwd))) return std::nullopt;
  k.cwd = cwd;
  struct stat here{};
  if (::stat(".", &here) == 0) k.cwd_id = std::to_string(here.st_dev) + ":" + std::to_string(here.st_ino);
  if (k.run.rfind("-m ", 0) != 0) {
    k.script_digest = digest(k.run[0] == '/' ? k.run : k.cwd + "/" + k.run);
    if (k.script_digest.empty()) return std::nullopt;
  }
  for (const auto& kv : spec.env) {
    if (!per_attempt().count(kv.substr(0, kv.find('=')))) k.group_env.push_back(kv);
  }
  std::sort(k.group_env.begin(), k.group_env.end());
  if (spec.binding) {
    for (int c : spec.binding->cpus) k.binding += std::to_string(c) + ",";
    k.binding += "/" + std::to_string(spec.binding->numa_node);
  }
  return k;
}

std::string SpareKey::differs(const SpareKey& now) const {
  if (interpreter != now.interpreter) return "the interpreter or its flags changed";
  if (interpreter_id != now.interpreter_id) return "the interpreter " + now.interpreter[0] + " changed";
  if (run != now.run) return "the script changed (" + run + " -> " + now.run + ")";
  if (script_digest != now.script_digest) return "the script " + now.run + " was edited";
  if (cwd != now.cwd || cwd_id != now.cwd_id) return "the working directory changed";
  if (binding != now.binding) return "its CPU binding changed";
  if (group_env != now.group_env) {
    std::vector<std::string> diff;
    std::set_symmetric_difference(group_env.begin(), group_env.end(), now.group_env.begin(), now.group_env.end(),
                                  std::back_inserter(diff));
    std::set<std::string> names;
    for (const auto& kv : diff) names.insert(kv.substr(0, kv.find('=')));
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    return "the environment changed (" + list + ")";
  }
  return "";
}

}  // namespace ddprun::agent
