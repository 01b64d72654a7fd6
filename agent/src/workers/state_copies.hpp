#pragma once
// The workers' state across nodes (docs/usage.md: State across nodes). In a round of several
// nodes, each agent sends every new committed state of its ranks to its buddy, the node of the
// next group rank, which keeps the two newest of each rank (workers/state_link.hpp). A step
// counts as replicated once the buddies of every rank of the job hold it: each agent adds its
// ranks' acknowledgements to ddprun/state/R/step/S in the round's workers' store, and the one
// that completes the count sets ddprun/state/R/done/S; the agent then writes the area's newest
// generation at kReplicatedAt. While copies are on (kCopiesAt), every save first waits until the
// area's newest state is replicated (state_layout.hpp: copies_hold()), at most the hold limit
// (kHoldLimitAt, this side's own bound and a margin). So every survivor and every buddy holds the
// last replicated step, every rank sends every save, and ddprun.state.load() agrees on that step
// when a node is lost.
//
// State follows the rank: before a round's copies start, each area's state is put in place for
// the rank it now has (workers/state_placement.hpp).
//
// One thread, started by the first round of a multi-node job, prepares each round and then
// sends; the server of copies runs on a second (and one a connection). A single-node job starts
// none.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rounds/rendezvous.hpp"

namespace ddprun::rendezvous {
class TcpStore;
}
#include "workers/state_link.hpp"
#include "workers/state_placement.hpp"

namespace ddprun::agent {

class StateAreas;

class StateCopies {
 public:
  // `host`: how the other nodes reach this one. `bytes_per_s`: the pace of the copies to the
  // buddy (0: none; each rank's state still follows it). `budget`: the bytes of state kept for
  // other nodes (and of this node's ranks that moved) at most. `secret`: the job's, if it has one
  // (the copy key is derived from it, with `run_id`).
  StateCopies(const StateAreas& areas, std::string host, std::uint64_t bytes_per_s, std::uint64_t budget,
              std::string secret, std::string run_id);
  ~StateCopies();
  StateCopies(const StateCopies&) = delete;
  StateCopies& operator=(const StateCopies&) = delete;

  // What this node offers a round it joins: where its copies are served (the server starts with
  // the first call), and whether it holds any state. Throws ddprun::Error where the server cannot
  // start.
  rounds::StateOffer offer();
  // A round of several nodes is ready: puts each area's state in place for its rank (fetching
  // from the others where it moved), then calls `ready` (on the thread of the copies: post it),
  // and copies the round's saves to the buddy until the next prepare() or stop_sending().
  // Throws ddprun::Error where its thread cannot start (the server starts with offer(), called first).
  void prepare(const rounds::RoundInfo& info, std::function<void()> ready);
  // The round is over: no more copies for it (a send in flight ends).
  void stop_sending();

 private:
  struct Round;
  void run();
  void settle(Round& r);  // the state of each area put in place for its rank
  void arm(const rounds::RoundInfo& info) noexcept;  // the round's copies begin
  // What the copies of a round have done so far (send()'s, across the passes it retries).
  struct Sending {
    struct Pending {
      std::uint64_t gen = 0, at = 0;  // the generation sent, its slot's offset
      std::int64_t step = 0;
      std::chrono::steady_clock::time_point since;
    };
    Round& round;
    std::vector<std::uint64_t> sent;                    // per local rank: the newest generation taken
    std::vector<std::optional<std::int64_t>> added;     // the last step counted
    std::vector<std::optional<Pending>> pending;        // sent, its step not yet replicated
    std::unique_ptr<rendezvous::TcpStore> store;        // the round's workers' store (made again after a failure)
    bool first_done = false, unpinned = false;
    bool copied = false;                                // it copied a state this round (then looks every 5 ms)
    std::optional<std::int64_t> owed_done{};            // a step counted whole whose done mark failed: marked again
    void unpin(const StateAreas& areas);                // the saves stop waiting for the copies
  };
  void send(Round& r);    // until the round ends
  bool has_new(const Sending& s) const;  // an area's newest state not sent yet, or a step pending
  bool pass(Sending& s);  // false: idle (nothing to send, no step pending)
  bool send_new(Sending& s);         // each area's new state to the buddy; true where one was sent
  void count_sent(Sending& s, std::size_t u);  // local rank u's pending step counted once; done when all are
  bool mark_replicated(Sending& s);  // steps every rank's buddy holds become the areas' replicated ones; false: none pending
  // How long the saves wait for a replicated step before they stop waiting for the copies.
  std::chrono::steady_clock::duration give_up() const;
  bool wanted(int round) const;
  void pause(int round, std::chrono::milliseconds d);  // up to `d`; ends once the round's copies are not wanted
  void cut_in_flight();  // shuts the connection of the copy in flight down, if any
  // The connection of a copy in flight, for cut_in_flight(), while it lives.
  struct InFlight {
    InFlight(StateCopies& c, int fd);
    ~InFlight();
    StateCopies& copies;
  };

  const StateAreas& areas_;
  const std::uint64_t bytes_per_s_;
  const std::string secret_, run_id_;
  StateLinkServer server_;
  StatePlacement placement_;  // the thread's

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::unique_ptr<Round> next_;      // a round to prepare
  std::atomic<int> sending_{-1};     // the round whose saves are copied; -1: none
  std::atomic<bool> stop_{false};    // the agent ends
  std::atomic<bool> cancel_{false};  // ends a copy in flight (the round is over)
  std::mutex in_flight_mu_;
  int in_flight_fd_ = -1;  // the connection of the copy in flight; -1: none
  std::thread thread_;
};

}  // namespace ddprun::agent
