#pragma once
// A fake of the nccl::Api seam (runtime/src/nccl_api.hpp) for tests and benchmarks on machines
// without a GPU. Not part of the runtime library.
//
// What it models, so that the backend's logic meets what it meets on a GPU:
// - "device memory" is host memory (filled with 0xAB bytes, since cudaMalloc does not zero);
// - streams are queues run in order: copies, memsets and casts run when their stream reaches
//   them, a stream waiting for an event holds until the event's point is passed, a collective
//   completes when every rank of its communicator has reached it (the ranks of a test are
//   threads sharing one Fabric), and nothing runs ahead of the point where it was queued;
// - communicators are blocking: init and split return when every rank has called them;
//   comm_abort ends (drops) the communicator's queued collectives, as NCCL's kernels exit;
// - the calling thread's current device (set_device), checked by every call that does device
//   work: a call made on a thread whose device is not the one of the stream, event or memory it
//   uses is recorded in State::wrong_device (a real GPU would quietly work on device 0);
// - scripted failures per collective (Fate).
// Every blocking call of the fake gives up after kFakeWait with an error, so that a broken
// backend fails its test instead of hanging it.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nccl_api.hpp"

namespace ddprun::runtime::nccl::fake {

inline constexpr std::chrono::seconds kFakeWait{60};

// What the fake does with a rank's n-th collective (0-based, counted over every communicator of
// that rank's Api): complete; never complete (a peer that stalls: only an abort ends it); never
// complete and report an asynchronous error (a peer that died); fail when enqueued; block the
// call itself until the communicator is aborted (NCCL connecting to a dead peer on first use).
enum class Fate { kComplete, kHang, kPeerDies, kEnqueueError, kCallHangs };

// One rank's fake: its script and what it saw. Counters may be read while the backend runs.
struct State {
  int devices = 1;                    // device_count()
  std::map<int, Fate> fates;          // set before use
  bool destroy_hangs = false;         // comm_destroy blocks (until the fabric shuts down)
  // The call of this name ("cudaMalloc", "cudaMemcpyAsync", ...) fails with a CUDA error.
  std::string failing_call;
  std::atomic<int> collectives{0}, inits{0}, splits{0}, aborts{0}, destroys{0}, casts{0};
  std::atomic<int> mallocs{0}, frees{0}, events_created{0}, events_destroyed{0};
  std::atomic<int> set_device_calls{0};

  // Calls made on a thread whose current device was not the device of what they used.
  std::vector<std::string> wrong_device() const;
  void note_wrong_device(std::string what);

 private:
  mutable std::mutex mu_;
  std::vector<std::string> wrong_device_;
};

class Fabric;
// The meeting point of the ranks of one test (their communicators, streams and events).
std::shared_ptr<Fabric> make_fabric();
// Ends every call blocked in the fabric with an error (a test's clean-up).
void shutdown(Fabric& fabric);

// The fake Api of one rank. Ranks that form communicators together share `fabric`.
std::shared_ptr<Api> make_api(std::shared_ptr<State> state, std::shared_ptr<Fabric> fabric = make_fabric());

// Test hooks on a stream made by the fake (the trainer's compute stream in tests).
// A host function the stream runs when it reaches this point (a "kernel").
void launch(Api& api, Handle stream, std::function<void()> fn);
// Holds the stream at this point until the returned gate is opened.
class Gate {
 public:
  virtual ~Gate() = default;
  virtual void open() = 0;
};
std::unique_ptr<Gate> hold(Api& api, Handle stream);

}  // namespace ddprun::runtime::nccl::fake
