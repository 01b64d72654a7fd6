#pragma once
// A fake of the nccl::Api seam (runtime/src/nccl_api.hpp) for tests and benchmarks on machines
// without a GPU: device memory is host memory, the collectives of a one-rank communicator
// complete when their stream reaches them, and the outcome of each collective can be scripted
// (complete, stall, a peer dies, fail when enqueued). Not part of the runtime library.

#include <map>
#include <memory>
#include <set>
#include <string>

#include "nccl_api.hpp"

namespace ddprun::runtime::nccl::fake {

// What the fake does with the n-th collective (0-based): complete, never complete (a peer that
// stalls: only the time-out ends it), never complete and report an asynchronous error (a peer
// that died), or fail when enqueued.
enum class Fate { kComplete, kHang, kPeerDies, kEnqueueError };

// Shared by the fake and the test that inspects it.
struct State {
  std::map<int, Fate> fates;
  int collectives = 0;
  int events_created = 0, events_destroyed = 0;
  int aborts = 0, destroys = 0, finalizes = 0, mallocs = 0, frees = 0;
  bool peer_died = false;  // async_error reports it from now on
  Status finalize_result = Status::ok();
  int finalize_polls_in_progress = 0;  // async_error answers kInProgress this often after finalize
  bool finalize_hangs = false;         // ... or for ever
  bool finalizing = false;
  std::set<Handle> live_events;
  // NCCL 2.28 on a non-blocking communicator: every collective returns ncclInProgress and is
  // launched by a thread NCCL starts for it; the communicator reports kInProgress until that
  // thread is done. Off: collectives are enqueued by the call itself.
  bool launch_thread = false;
};

std::unique_ptr<Api> make_api(std::shared_ptr<State> state);

}  // namespace ddprun::runtime::nccl::fake
