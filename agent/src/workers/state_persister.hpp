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
// The file is written whole or not at all: into a hidden file beside `path`, flushed, then
// renamed over `path`. A failure (a full disk, a missing folder) leaves any earlier file as it
// was; it is answered to the worker and logged.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::agent {

class StateAreas;

// Writes the slot of the area `area_fd` (`area_bytes` long) that holds `generation` committed to
// `path` (absolute) as a one-slot state file, calling `copied` once the slot is read. Returns its
// step, or nullopt where that generation is not committed yet (a save being copied). Throws
// ddprun::Error saying why not (a newer save overwrote it, a path refused, the file system's
// error); `path` is then as it was.
std::optional<std::int64_t> persist_area(int area_fd, std::uint64_t area_bytes, std::uint64_t generation,
                                         const std::string& path, const std::function<void()>& copied = {});

class StatePersister {
 public:
  // Serves the requests of `areas`' workers every `poll` until destroyed.
  explicit StatePersister(const StateAreas& areas, std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  // Serves the requests already made (the job's last persist lands), then ends.
  ~StatePersister();
  StatePersister(const StatePersister&) = delete;
  StatePersister& operator=(const StatePersister&) = delete;

 private:
  void run();
  // `last`: the final pass; a request for a save never committed is answered, not kept.
  void serve(int local_rank, bool last);

  const StateAreas& areas_;
  const std::chrono::milliseconds poll_;
  std::vector<std::uint64_t> served_;  // per local rank: the last request number answered
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddprun::agent
