#pragma once
// A worker's writes to storage, as the agent reads them (docs/usage.md: Hangs): a save of any
// kind (numpy, safetensors, torch.distributed.checkpoint, a writer process of its own), where
// the heartbeat's saving() is torch.save's alone. The write_bytes (/proc/PID/io) of its training
// process and every live process below it (a reaped child's count is its parent's) is read at
// each check:
//   - while its main thread steps, its own pace of writing: the most it wrote in a
//     kWritingPaceWindow of the last kWritingPaceWindows (a thread that logs, steadily or in
//     bursts, is no save). A window counts once a step is seen after its end: one that ends in a
//     silence not yet long enough to call the thread still may hold the start of a save, and
//     the first after a save (still, or torch.save) is dropped: it may hold the save's tail;
//   - while its main thread holds still, a save: kWritingBytes within kWritingWindow, and
//     kWritingOverPace x that pace.
// It is saving for kWritingWindow after such a burst, and for kFlushGrace after it while one of
// its threads, or one of a process below it, waits on the disk (D state: the save's fsync or
// close, which write_bytes does not count). A save whose process hangs stops both, and is a hang
// like any other.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

// 0.8 MB/s at least: above what a program's logs write, below any checkpoint's pace.
constexpr std::uint64_t kWritingBytes = 8ull << 20;
constexpr std::chrono::seconds kWritingWindow{10}, kWritingPaceWindow{2};
constexpr double kWritingOverPace = 4;
constexpr std::chrono::seconds kFlushGrace{120};
constexpr std::size_t kWritingPaceWindows = 30;  // a minute of windows

class WriteWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // A look at `pid` (the training process): `last_step`, when its main thread's last step was
  // seen; `still`, it holds still since; `torch_save`, it is in torch.save (whose beats are no
  // steps: no pace is learned then).
  void look(pid_t pid, Clock::time_point last_step, bool still, bool torch_save, Clock::time_point now);
  // Writing at a save's pace now, or waiting on the disk since.
  bool saving(Clock::time_point now) const;
  // It wrote a save's burst within kFlushGrace (a save by writes, not torch.save).
  bool wrote_lately(Clock::time_point now) const;

 private:
  pid_t pid_ = -1;
  std::uint64_t bytes_ = 0;  // the count at `since_`
  struct Rate {  // a window's writes while it stepped (its pace: the most of them)
    Clock::time_point end;
    double bytes_per_s;
  };
  std::deque<Rate> rates_;      // windows a step was seen after
  std::deque<Rate> tentative_;  // windows no step was seen after yet
  bool paused_ = false;         // the last look was still, or in torch.save: the next window starts afresh
  Clock::time_point since_, wrote_;
};

// The bytes `pid` has caused to be written to storage (/proc/PID/io write_bytes: counted as it
// dirties a file's pages, so a save to a disk or network file system counts at once, a pipe, a
// socket or a tmpfs not at all); nullopt when it cannot be read.
std::optional<std::uint64_t> storage_written(pid_t pid, const std::string& proc_root = "/proc");
// `pid` and the live processes below it (PROC_ROOT/PID/task/TID/children), parents first.
std::vector<pid_t> with_descendants(pid_t pid, const std::string& proc_root = "/proc");
// storage_written of `pid` and every live process below it; nullopt when `pid`'s cannot be read.
std::optional<std::uint64_t> storage_written_below(pid_t pid, const std::string& proc_root = "/proc");

}  // namespace ddprun::agent
