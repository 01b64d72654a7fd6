#pragma once
// Who holds a hung job up, and why: a decision over what ddprun read of every rank (README:
// Hangs). Pure: the worker group reads the processes (/proc, the stack signal, ddprun-stack),
// this names the rank.
//
// A rank waits inside a collective when its Python stack is in torch.distributed, or in
// backward() while its native main thread is in DDP's Reducer (a gradient all-reduce runs in C++
// under backward) or it sleeps there, or its native main thread is in Gloo or NCCL. The rules, in order:
//   1. a rank stopped (SIGSTOP, state T) is to blame; then one in uninterruptible sleep (D)
//      outside every collective;
//   2. ranks outside every collective while others wait in one: the outside ones are to blame
//      (spinning when busy most of the time before ddprun read them, else stuck);
//   3. every read rank waits in one collective beside ranks that answered no stack signal and
//      whose native main thread could not be read either: those are to blame (held in the
//      kernel, most likely: a slow file system's long write);
//   4. every read rank waits, in different collectives: a mismatch, each group named;
//   5. otherwise no rank is blamed: what each does is said.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "observe/stack_dump.hpp"

namespace ddprun::agent {

// One rank as read at a hang report, before any signal was sent to it.
struct RankView {
  int rank = -1;
  int local_rank = -1;
  std::string host;
  pid_t pid = -1;      // the process read (the Python process below a wrapper, or the program)
  char state = '?';    // /proc/PID/stat's state: R S D T t Z, '?' when unread
  double cpu = -1;     // share of the time its main thread was busy (on a CPU or runnable); -1: unknown
  bool silent = false; // its heartbeat lapsed (a suspect)
  std::vector<StackFrame> python;  // innermost first; empty: none read
  std::vector<StackFrame> native;  // its main thread, innermost first; empty: none read
  std::string python_note;         // why there is no Python stack, if there is none
};

// The Python note of a rank signalled for its stack that wrote none (the start of the note).
constexpr const char* kStackSignalUnanswered = "the stack signal wrote nothing within ";

enum class HangKind { stopped, uninterruptible, stuck, spinning, mismatch, undecided };
const char* to_string(HangKind k);

struct HangVerdict {
  HangKind kind = HangKind::undecided;
  std::vector<int> blamed;  // ranks, lowest first; empty when undecided
  std::string text;         // one paragraph, for the report and the failure summary
};

// The collective a rank waits in ("DDP's all-reduce", "broadcast", "barrier", "a CUDA
// synchronize", "gloo", "NCCL", ...), or "" when it waits in none.
std::string collective_of(const RankView& r);

HangVerdict decide_hang(const std::vector<RankView>& ranks);

// The report printed once when a worker is found silent: the verdict first, then why it was
// suspect, each rank's state and stacks, and what follows. `stop_in` zero: the group is stopped now.
// `node_only`: the job has other nodes; the verdict is this node's, the job's follows.
std::string format_hang_report(const HangVerdict& verdict, const std::vector<RankView>& ranks, const std::string& host,
                               const std::string& why, const std::vector<std::string>& files,
                               std::chrono::milliseconds stop_in, int silent_rank, bool node_only = false);

// "0, 2-7": ranks as a user reads them.
std::string rank_list(std::vector<int> ranks);

}  // namespace ddprun::agent
