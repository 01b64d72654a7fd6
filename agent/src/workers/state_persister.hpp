#pragma once
// Persisting the workers' in-memory state to disk in the background (docs/usage.md: In-memory
// state): a worker's `ddprun.state.persist(path)` (or MemoryState::persist) writes a request
// into its area's header and goes on training; the agent's persister thread finds it, writes the
// area's latest committed slot to `path`, and answers in the header. The copy is the kernel's
// (sendfile from the memfd), on the agent's thread: it costs the training nothing, and a worker
// that dies meanwhile does not stop it.
//
// The request (ddprun/common/state_layout.hpp, at kRequestAt) names a generation, the worker's
// last save, and a path. It is a sequence lock: the worker writes an odd number, then the rest,
// then the next even number; the persister takes a request whose number is even and the same
// before and after it read the rest. A request made before the last was served replaces it.
// Until the agent has copied the slot (kCopiedAt), the worker's saves leave it alone, so every
// rank that asked at one step writes that step. A save still being copied is waited for.
//
// One thread copies each new request's slot (sendfile into the page cache, at memory speed: the
// pin is short) and hands it to a second, which flushes each copy and renames it into place
// (the disk's time), then answers. The file is written whole or not at all:
// into a hidden file of a random name beside `path`, flushed, then renamed over `path`. A failure (a full disk, a missing folder) leaves any earlier file as it
// was; it is answered to the worker and logged.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::agent {

class StateAreas;

class StatePersister {
 public:
  // Serves the requests of `areas`' workers every `poll` once asked() has found the first; no
  // thread runs before (the agent alone runs one thread until something needs another).
  explicit StatePersister(const StateAreas& areas, std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  // Whether a worker has asked: its threads start at the first request and poll from then on
  // (the agent's loop asks until then). Throws ddprun::Error where a thread cannot be made.
  bool asked();
  // Serves the requests already made (the job's last persist lands), then ends.
  ~StatePersister();
  StatePersister(const StatePersister&) = delete;
  StatePersister& operator=(const StatePersister&) = delete;

 private:
  struct Copied;
  void start();
  bool started() const { return copier_.joinable(); }
  void run();  // the copying thread: polls, copies, hands over
  // `last`: the final pass; a request for a save never committed is answered, not kept.
  void serve(bool last);
  void flush();  // the flushing thread: each copy flushed and renamed, each request answered
  // Refuses (throws) a request of `local_rank` for a path another local rank wrote at `step`.
  void shared_path(int local_rank, const std::string& path, std::int64_t step);
  void mark_copied(int local_rank, std::uint64_t number);
  void answer(const Copied& c);

  const StateAreas& areas_;
  const std::chrono::milliseconds poll_;
  std::vector<std::uint64_t> served_;  // per local rank: the last request number taken (the copier's)
  struct Writer {
    int local_rank;
    std::int64_t step;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Writer> writers_;  // per path asked for in the last minute: the last rank, its step (the copier's)
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool copied_all_ = false;   // the copier has ended: the flusher ends once the queue is empty
  std::list<Copied> copied_;  // from the copier to the flusher (a list: Copied is defined in the .cpp)
  std::thread flusher_, copier_;
};

}  // namespace ddprun::agent
