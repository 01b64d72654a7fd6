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
  // Keeps the stack dumps a report named past the end, saying where: the temporary directory, or
  // where that is in memory (/dev/shm) a copy of the dumps on disk (/tmp). (A --log_dir stays.)
  void keep_for_stacks();

 private:
  std::string run_dir_;
  std::string temp_root_;  // the temporary directory ddprun created, or empty
  bool keep_ = false;
  bool kept_for_stacks_ = false;
  std::string keep_stacks();  // at the end: where the dumps are kept
};

// Creates `dir` and its missing parents, each new one 0700 (existing ones are left as they are),
// refusing another user's link planted in a shared sticky directory on the way (safe_path.hpp).
void make_private_dirs(const std::string& dir);

}  // namespace ddprun::agent
