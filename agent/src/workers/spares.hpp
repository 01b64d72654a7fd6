#pragma once
// Warm spares for Python workers (docs: "Warm spares"). While a group runs, one spare per
// local rank: an interpreter started through the same runner as the workers (so the
// containment, cgroup and guardian cover it), which imports torch and --preload's modules on a
// thread at the lowest priority, then waits on its descriptor 3. At the next attempt the
// group hands it the worker's argv, environment and working directory instead of starting a
// new interpreter (_ddprun_spare.py runs the script as a fresh interpreter would).
//
// A spare is thrown away, and its worker starts cold, when the interpreter, the interpreter's
// flags, the script (its content), the working directory, the CPU binding or the group-wide
// environment (every variable but those ddprun sets per rank and attempt) differs from what it
// was made for; when a module it imported changed since, or came from another file than the
// last attempt's worker had it from (--preload=auto); when one of its threads is left at a lower
// priority than the worker's and ddprun may not raise it; or when it died while it waited.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.hpp"
#include "workers/process_runner.hpp"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct WorkerSpec;

// What a spare stands in for, read from a worker's argv and the machine: equal or not.
struct SpareKey {
  std::vector<std::string> interpreter;  // argv[0] and its flags ("-u")
  std::string interpreter_id;            // device, inode, size, mtime of argv[0]
  std::string run;                       // "PATH" (a script) or "-m MODULE"
  std::vector<std::string> args;         // the script's arguments (sent, not compared)
  std::string script_digest;             // a script's content; "" for -m
  std::string cwd, cwd_id;
  std::vector<std::string> group_env;    // sorted, without the per-rank and per-attempt variables
  std::string binding;
  // Why `now` cannot use a spare made for *this ("" if it can).
  std::string differs(const SpareKey& now) const;
  // nullopt: not a Python worker a spare can run (--no_python, -c, unknown flags).
  static std::optional<SpareKey> of(const WorkerSpec& spec);
};

class SparePool {
 public:
  SparePool(boost::asio::io_context& io, ProcessRunner& runner, SpareOptions opt);
  ~SparePool();  // kills every spare
  SparePool(const SparePool&) = delete;
  SparePool& operator=(const SparePool&) = delete;

  // A spare for each spec's local rank that has none (or one made for something else).
  void make(const std::vector<WorkerSpec>& specs);
  // Each spec's spare, told to run it: its pid and output pipes, once it has read its order.
  // nullopt: start it cold (why is logged; a spare that cannot serve, or died, is killed).
  std::vector<std::optional<ProcessRunner::Started>> hand_over(const std::vector<const WorkerSpec*>& specs);
  // A child ended: true if it was a spare (then forgotten).
  bool on_exit(pid_t pid);
  void discard_all();

  int count() const;
  int ready_count() const;
  long long memory_bytes() const;  // the spares' proportional set size (their RSS where unknown)

 private:
  struct Spare;
  void start_one(const WorkerSpec& spec, SpareKey key);
  void read_ready(const std::shared_ptr<Spare>& s);
  void kill(Spare& s);
  std::string send_order(Spare& s, const WorkerSpec& spec);
  std::vector<std::string> await_orders_read(const std::vector<std::shared_ptr<Spare>>& sent);
  // How long a live spare may take to read its order (it waits in read() from its start).
  static constexpr std::chrono::milliseconds kOrderReadLimit{3000};
  // How long a ready spare's import thread may take to end at a hand-over.
  static constexpr std::chrono::milliseconds kImportThreadEnd{200};
  boost::asio::io_context& io_;
  ProcessRunner& runner_;
  SpareOptions opt_;
  std::map<int, std::shared_ptr<Spare>> by_rank_;  // local rank -> its spare
  // Spares handed over (workers now): their ready pipes are read until they end, for a "cold"
  // line (_ddprun_spare.py found after the hand-over that it must run as a new interpreter).
  std::vector<std::shared_ptr<Spare>> handed_;
};

// A process's memory as /proc tells it: Pss (smaps_rollup), else VmRSS; -1 when unknown.
long long process_memory_bytes(pid_t pid);

}  // namespace ddprun::agent
