#pragma once
// Where a job's files go: <log_dir>/<run_id>/attempt_<round>/<local_rank>/ (logs, error file,
// heartbeat). Without --log_dir, a fresh directory of ddprun's own (ddprun-RANDOM, 0700) under $TMPDIR,
// else /dev/shm when nothing in it is kept, else /tmp: the only thing ddprun ever removes. Directories it creates are 0700, files 0600: logs may hold
// what workers print.

#include <functional>
#include <string>
#include <vector>

namespace ddprun::agent {

struct AgentOptions;

class RunDir {
 public:
  // Creates the run directory. Throws ddprun::Error with what to do. `announce`: told the name
  // of the temporary directory this will remove, before it is made (the guardian's).
  explicit RunDir(const AgentOptions& opt, const std::function<void(const std::string&)>& announce = {});
  // Removes the temporary directory ddprun created, and nothing else: never --log_dir, never a
  // parent. Kept when logs were asked for (--redirects, --tee) so they can be read.
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const std::string& path() const { return run_dir_; }
  // The temporary directory this removes at the end, or "" (--log_dir, or logs kept): the one the
  // guardian removes when the agent dies without removing it.
  std::string disposable() const;
  // <run dir>/attempt_<round>/<local_rank> for local ranks 0 .. count-1, in order, created (the
  // run and attempt directories opened once for all).
  std::vector<std::string> worker_dirs(int round, int count) const;
  // The stack dumps a report is about to name, where they will outlive the agent, however it ends
  // (the guardian removes the temporary directory when the agent is killed): copied now from the
  // temporary directory into one of their own beside it (ddprun-stacks-XXXXXX in /tmp for one in
  // /dev/shm, else in the same place), which nothing removes, as attempt_N/LOCAL_RANK/stack.txt.
  // A --log_dir, or a temporary directory kept for its logs, stays as it is: the same paths.
  // ddprun says at the end where they are.
  std::vector<std::string> keep_stacks(const std::vector<std::string>& files);

 private:
  std::string run_dir_;
  std::string temp_root_;  // the temporary directory ddprun created, or empty
  bool keep_ = false;
  std::string stacks_dir_;     // where the dumps are copied, once one was
  bool kept_for_stacks_ = false;  // a copy failed: the temporary directory is kept whole instead
};

// Creates `dir` and its missing parents, each new one 0700 (existing ones are left as they are),
// refusing another user's link planted in a shared sticky directory on the way (safe_path.hpp).
void make_private_dirs(const std::string& dir);

}  // namespace ddprun::agent
