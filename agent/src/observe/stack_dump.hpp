#pragma once
// Stacks of hung workers. Python workers run with PYTHONFAULTHANDLER=1 and are stopped with
// SIGABRT: Python prints every thread's traceback to stderr before dying. Native workers are
// read from outside with ddprun-stack (libdw), else eu-stack (elfutils), else gdb; without
// any, one line says how to get them. Parsed into frames for the failure summary, which groups
// identical stacks:
//   ranks 0,1,3: all_reduce (train.py:42) <- train_step (train.py:80)
//   rank 2: load_batch (data.py:17) <- ...

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

struct StackFrame {
  std::string function;  // "stuck_in_all_reduce", "<module>", "?" when unknown
  std::string file;      // base name; empty when unknown
  int line = 0;
};

// The native stack of `pid` as text (ddprun-stack, whatever it reads; only where it is missing,
// eu-stack, else gdb, never on a process with a thread in uninterruptible sleep, and a SIGCONT
// after them unless it was stopped before), bounded by
// `limit`: the tool is killed when it takes longer. Blocking: call it off the loop. Never throws:
// the text says what failed.
std::string native_stack_text(pid_t pid, std::chrono::milliseconds limit);

// Whether a thread of `pid` is in uninterruptible sleep (D: waiting on a disk or a file system).
bool waits_on_disk(pid_t pid, const std::string& proc_root = "/proc");

// A warm spare runs the script inside its driver (_ddprun_spare.py, by exec), so a warm worker's
// Python stack ends in the driver's frames below the script's outermost one; a cold one's does
// not. They are dropped wherever a stack is read, so that a warm and a cold rank stuck at the
// same line read the same (and group together). A thread stuck in the driver itself (before the
// script ran: no frame of the script above) keeps them.
bool is_spare_driver_frame(const StackFrame& f);
// faulthandler's text without the driver's "File ..." lines below a script's: what stack.txt
// holds; and lines of it (the stderr tail of a failure summary).
std::string without_spare_driver(const std::string& python_text);
std::deque<std::string> without_spare_driver(std::deque<std::string> lines);

// The frames of the thread that matters, innermost first: for Python, faulthandler's "Current
// thread" (else the first thread), without the spare driver's frames below the script's; for
// native, the main thread (TID == PID, else the first), without the C library's frames on top.
std::vector<StackFrame> parse_python_stack(const std::string& text);
std::vector<StackFrame> parse_native_stack(const std::string& text);

// "stuck_in_all_reduce (x.py:5) <- main (x.py:9) <- <module> (x.py:12)": at most `depth` frames.
std::string describe_frames(const std::vector<StackFrame>& frames, std::size_t depth = 3);

// Whether a stack waits inside a collective: a frame of a collective call (all_reduce,
// broadcast, all_gather, reduce_scatter, barrier, a Work's wait, the Reducer's finalize), of
// Gloo or of NCCL, or of torch.distributed.
bool in_collective(const std::vector<StackFrame>& frames);

// The rank to blame for a hang: the lowest rank whose stack is outside any collective while
// other ranks wait inside one (they wait for it). nullopt when every read stack is inside, or
// every one outside, or none was read.
struct StuckRank {
  int rank = -1;
  std::string where;          // its stack, describe_frames
  std::vector<int> waiting;   // the ranks inside a collective
};
std::optional<StuckRank> rank_outside_collectives(const std::map<int, std::vector<StackFrame>>& by_rank);

// One line per distinct stack, ranks grouped: "  ranks 0,1: a (f.py:1) <- b (f.py:2)".
std::string summarize_stacks(const std::map<int, std::vector<StackFrame>>& by_rank);

}  // namespace ddprun::agent
