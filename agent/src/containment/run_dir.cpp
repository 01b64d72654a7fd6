#include "containment/run_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <spdlog/spdlog.h>
#include <vector>

#include "ddprun/agent/agent_options.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "containment/private_files.hpp"
#include "containment/safe_path.hpp"

namespace ddprun::agent {

void make_private_dirs(const std::string& dir) { open_dir_refusing_planted_links(dir); }

namespace {

// Where ddprun's own temporary directory goes: $TMPDIR when set; else, when nothing in it
// outlives the job, /dev/shm (a tmpfs: a worker's directory and files cost microseconds there,
// against 0.1-0.3 ms each on a journalled disk, removal included); else /tmp.
std::string make_temp_root(const AgentOptions& opt, bool keep, const std::function<void(const std::string&)>& announce) {
  auto t = opt.base_env.find("TMPDIR");
  const bool chosen = t != opt.base_env.end() && !t->second.empty();
  std::vector<std::string> candidates;
  if (chosen) {
    candidates = {t->second};
  } else {
    if (!keep) candidates.push_back("/dev/shm");
    candidates.push_back("/tmp");
  }
  // As mkdtemp (a random name, made 0700 only if it did not exist), but named before it is made:
  // the guardian then knows what to remove whenever the agent is killed.
  int e = 0;
  for (const auto& dir : candidates) {
    for (int attempt = 0; attempt < 16; ++attempt) {
      std::string path = dir + "/ddprun-" + random_hex(12);
      if (announce && !keep) announce(path);
      if (::mkdir(path.c_str(), 0700) == 0) return path;
      e = errno;
      if (e != EEXIST) break;
    }
  }
  throw Error("cannot create a temporary directory in '" + candidates.back() + "': " + std::strerror(e) +
              " (set TMPDIR, or give --log_dir)");
}

// HOST.PID: this agent's directory in a --log_dir that nodes share ('/' cannot be in a host name;
// anything else but the portable file name characters becomes '_').
std::string node_dir_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "host");
  std::string name = host;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  if (name == "." || name == "..") name = "host";
  return name + "." + std::to_string(::getpid());
}

}  // namespace

RunDir::RunDir(const AgentOptions& opt, const std::function<void(const std::string&)>& announce)
    : keep_(opt.redirects.any() || opt.tee.any() || !opt.duplicate_stdout_filters.empty() ||
            !opt.duplicate_stderr_filters.empty()) {
  std::string base = opt.log_dir;
  if (base.empty()) base = temp_root_ = make_temp_root(opt, keep_, announce);
  std::string name = opt.rdzv.run_id;
  try {
    // The base is the user's choice (or ddprun's own temporary one): made where missing, and
    // reached through no other user's link planted in a shared directory.
    Fd base_fd = open_dir_refusing_planted_links(base);
    // One node's run in a --log_dir that holds an earlier run's logs (the same run id): in
    // RUN_ID.2, .3, ... beside them, never over them. (Several nodes share RUN_ID, each below it.)
    if (!opt.log_dir.empty() && opt.rdzv.max_nodes <= 1) {
      for (int n = 2; n <= 10'000 && ::mkdirat(base_fd.get(), name.c_str(), 0700) != 0 && errno == EEXIST; ++n) {
        name = opt.rdzv.run_id + "." + std::to_string(n);
      }
    }
    run_dir_ = base + "/" + name;
    Fd run = open_private_dir(base_fd.get(), name, run_dir_);
    // Several nodes may share one --log_dir (a network filesystem, or agents on one host): each
    // agent's files go below a directory of its own, named by its host and pid.
    if (!opt.log_dir.empty() && opt.rdzv.max_nodes > 1) {
      const std::string node = node_dir_name();
      run_dir_ += "/" + node;
      open_private_dir(run.get(), node, run_dir_);
    }
  } catch (...) {
    if (!temp_root_.empty()) ::rmdir(temp_root_.c_str());
    throw;
  }
  if (!opt.log_dir.empty() || keep_) {
    spdlog::info("ddprun: worker logs in {}{}", run_dir_,
                 name == opt.rdzv.run_id ? "" : " (" + base + "/" + opt.rdzv.run_id + " holds an earlier run's)");
  }
}

RunDir::~RunDir() {
  for (const auto* dir : {&stacks_dir_, kept_for_stacks_ ? &run_dir_ : nullptr}) {
    if (dir && !dir->empty()) {
      spdlog::warn("ddprun: the workers' stack dumps are kept in {} (remove it once read; --log_dir puts them "
                   "where you choose)", *dir);
    }
  }
  if (temp_root_.empty() || keep_) return;
  remove_tree(AT_FDCWD, temp_root_.c_str());
}

std::vector<std::string> RunDir::keep_stacks(const std::vector<std::string>& files) {
  namespace fs = std::filesystem;
  if (temp_root_.empty() || keep_ || files.empty()) return files;
  if (stacks_dir_.empty()) {
    const bool in_memory = temp_root_.rfind("/dev/shm/", 0) == 0;  // (whose RAM a job's NCCL shares)
    std::string dir = (in_memory ? std::string("/tmp") : fs::path(temp_root_).parent_path().string()) +
                      "/ddprun-stacks-XXXXXX";
    if (::mkdtemp(dir.data()) != nullptr) stacks_dir_ = dir;
  }
  std::vector<std::string> kept;
  const std::string below = run_dir_ + "/";
  for (const auto& from : files) {
    std::error_code e = std::make_error_code(std::errc::invalid_argument);
    fs::path to;
    if (!stacks_dir_.empty() && from.rfind(below, 0) == 0) {
      e.clear();
      to = fs::path(stacks_dir_) / from.substr(below.size());
      // (attempt_N/LOCAL_RANK, made 0700 under a 0700 directory of this user's)
      for (const auto& d : {to.parent_path().parent_path(), to.parent_path()}) {
        if (!e && fs::create_directory(d, e)) fs::permissions(d, fs::perms::owner_all, e);
      }
      if (!e) fs::copy_file(from, to, fs::copy_options::overwrite_existing, e);
    }
    if (e) {  // the temporary directory is kept whole instead, where the report says
      keep_ = kept_for_stacks_ = true;
      return files;
    }
    kept.push_back(to.string());
  }
  return kept;
}

std::string RunDir::disposable() const { return keep_ ? std::string() : temp_root_; }

// Each level is opened below the last without following links, and checked: a private run
// directory is what guarantees that nobody else can have put anything inside it. The run and
// attempt directories are opened once for all the ranks.
std::vector<std::string> RunDir::worker_dirs(int round, int count) const {
  Fd run(::open(run_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (run.get() < 0) throw Error("cannot open the run directory '" + run_dir_ + "': " + std::strerror(errno));
  check_private(run.get(), run_dir_, true);
  const std::string attempt = run_dir_ + "/attempt_" + std::to_string(round);
  Fd a = open_private_dir(run.get(), "attempt_" + std::to_string(round), attempt);
  std::vector<std::string> dirs;
  dirs.reserve(static_cast<std::size_t>(count));
  for (int rank = 0; rank < count; ++rank) {
    const std::string dir = attempt + "/" + std::to_string(rank);
    open_private_dir(a.get(), std::to_string(rank), dir);
    dirs.push_back(dir);
  }
  return dirs;
}

}  // namespace ddprun::agent
