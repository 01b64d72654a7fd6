#pragma once
// How a node meets the others, round after round. The agent sees only this interface: a single
// node is a rendezvous of one; several nodes meet through a c10d store or etcd, with one set of
// round rules over either backend. Implementations never touch the network on the caller's
// thread: they work on threads of their own and post every result through `Post`.
//
// The life of a round, as the listener sees it:
//   join(r, rc, streak) -> on_round_ready(info) | on_rendezvous_failed(failure)
//   then exactly one on_round_over(outcome) for round r: a node failed, was lost, wants to join,
//   was stopped, or every node succeeded; or the rendezvous itself was lost.
//   finish(r) / leave(r) -> on_finished()

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/rounds/options.hpp"
#include "ddprun/rounds/records.hpp"

namespace ddprun::rounds {

struct RoundInfo {
  int round = 0;
  int restart_count = 0;
  Streak streak;  // the job's crash-loop streak as the round began: the same on every member
  int group_rank = 0;
  int group_world = 1;
  int world_size = 1;
  int rank_offset = 0;     // RANK of this node's local rank 0
  std::string store_host;  // the workers' store (MASTER_ADDR:MASTER_PORT)
  std::uint16_t store_port = 0;
  // The workers' in-memory state: the next member's state link (this node's buddy; empty: none),
  // how many members said they hold state as they arrived, and whether this node said so.
  std::string next_state_link;
  int state_holders = 0;
  bool holds_state = false;
  // Every member's record, by group rank: on group rank 0 only (it reads them once, for the
  // workers' store's allow-list); empty on the others, which read their own place alone.
  std::vector<NodeInfo> nodes;
};

// Why the rendezvous cannot go on: the job ends (the controller picks the exit code by kind).
struct RendezvousFailure {
  enum class Kind {
    timeout,      // too few nodes within join_timeout, a store that never answered
    stopped,      // a node was stopped by `signal` during the rendezvous
    finished,     // the job (this run id) is over
    done,         // the job succeeded while this node waited outside it for a place (exit 0)
    in_use,       // the run id or node rank is taken by another job or node
    refused,      // wrong or missing secret or credentials
    unreachable,  // the backend cannot be reached, or was lost
    malformed,    // a record that is not what ddprun writes
    usage,        // a setting that cannot work (exit 2)
  };
  Kind kind = Kind::unreachable;
  std::string message;
  int signal = 0;  // stopped

  // From an exception that ended a rendezvous operation.
  static RendezvousFailure of(const std::exception& e);
};
const char* to_string(RendezvousFailure::Kind k);

// How a round ended: `end` (the same on every node), or the rendezvous lost (`lost`).
struct RoundOutcome {
  int round = 0;
  std::optional<RoundEnd> end;
  RendezvousFailure lost;  // no `end`: why
};

// A store this node hosts, as it is now (metrics).
struct HostedStore {
  std::string role;  // "rendezvous" (the round records), "workers" (MASTER_ADDR:MASTER_PORT)
  std::size_t connections = 0, keys = 0, bytes = 0;
  double loop_latency_s = 0;  // how long a request to its I/O loop took to be served
};

// Runs a function on the agent's loop thread.
using Post = std::function<void(std::function<void()>)>;

// Runs `f` on the agent's loop thread once descriptor `fd` is readable (once; `fd` stays the
// caller's). What a single node's store waits on before it starts its thread.
using WhenReadable = std::function<void(int fd, std::function<void()> f)>;

// Self-fencing: told, from whatever thread renews this node's liveness, until when the other
// nodes cannot count this node lost. Whoever implements it stops this node's workers when that
// deadline passes without a renewal, so that no worker of a node counted lost runs beside the
// group the others start without it.
class Fence {
 public:
  virtual ~Fence() = default;
  virtual void renewed_until(std::chrono::steady_clock::time_point deadline) = 0;
  // No round runs here any more: nothing to fence until the next renewal.
  virtual void release() = 0;
};

class Rendezvous {
 public:
  struct Listener {
    virtual ~Listener() = default;
    virtual void on_round_ready(const RoundInfo& info) = 0;
    virtual void on_rendezvous_failed(const RendezvousFailure& failure) = 0;
    virtual void on_round_over(const RoundOutcome& outcome) = 0;
    virtual void on_finished() = 0;
    // This node is beyond the job's MAX and waits for a place (a standby node): it joins the
    // next round that has room, e.g. when a member is lost.
    virtual void on_waiting_for_place() {}
  };

  virtual ~Rendezvous() = default;
  virtual void set_listener(Listener& listener) = 0;
  // For the log: where and how nodes meet ("127.0.0.1:29400 (c10d, 2 to 4 nodes)"); empty for one node.
  virtual std::string describe() const = 0;

  // Joins round `round` with this node's restart count (-1: a node new to the job) and crash-loop
  // streak; the round's own (its first writer's) come back in RoundInfo. `state`: what this node
  // offers of the workers' in-memory state (in its record; a single node has no use for it).
  virtual void join(int round, int restart_count, const Streak& streak = {}, const StateOffer& state = {}) = 0;
  // Ends round `round` for every node, unless another node ended it first. `expect_next`: how
  // many nodes the next round waits for before closing without a last call (0: no hint).
  virtual void end_round(int round, const RoundEnd& why, int expect_next) = 0;
  // Every worker of this node exited 0; the round ends "success" once every node says so.
  virtual void report_success(int round) = 0;
  // The job ends after round `round`. With Ack::yes this node acknowledges the end, so that a
  // node hosting the rendezvous keeps it until the others have read the end (bounded); then
  // on_finished.
  enum class Ack { no, yes };
  virtual void finish(int round, Ack ack) = 0;
  // A stop signal while no round runs here: the nodes in (or on their way to) round `round` are
  // told; then on_finished.
  virtual void leave(int round, int signal) = 0;
  // Stops what runs in the background; waits a bounded time (a thread stuck on an unreachable
  // backend is left behind: it touches nothing but state it shares).
  virtual void shutdown() = 0;
  // The stores this node hosts now. Any thread; takes a round trip to each store's I/O loop.
  virtual std::vector<HostedStore> hosted_stores() const = 0;
};

// The rendezvous `opt.backend` names. `fence` (may be null) is told of every liveness renewal;
// it must outlive the rendezvous. With `when_readable`, a single node's store starts its thread
// when its first client connects (most launches of a non-PyTorch program have none), else when
// its first round has started the workers. Throws ddprun::Error when the node cannot take part
// (the store's address is in use, a malformed endpoint list).
std::unique_ptr<Rendezvous> make_rendezvous(const RendezvousOptions& opt, Post post, Fence* fence,
                                            WhenReadable when_readable = {});

}  // namespace ddprun::rounds
