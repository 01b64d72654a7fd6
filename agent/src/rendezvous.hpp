#pragma once
// How a node meets the others, round after round. The JobController sees only this interface:
// a single node is a rendezvous of one (LocalRendezvous); several nodes meet through the c10d
// store (StoreRendezvous); an etcd backend plugs in here too. Implementations never touch the
// network on the agent's loop: they do it on threads of their own and post every result back
// to the loop, where the listener is called.
//
// The life of a round, as the listener sees it:
//   join(r, rc) -> on_round_ready(info) | on_rendezvous_failed(message, code)
//   then exactly one on_round_over(outcome) for round r: a node failed, was lost, wants to join,
//   was stopped, or every node succeeded; or the rendezvous itself was lost.
//   finish(r) / leave(r) -> on_finished()

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "round_protocol.hpp"

namespace ddprun::agent {

struct RoundInfo {
  int round = 0;
  int restart_count = 0;
  int group_rank = 0;
  int group_world = 1;
  int world_size = 1;
  int rank_offset = 0;     // RANK of this node's local rank 0
  std::string store_host;  // the workers' store (MASTER_ADDR:MASTER_PORT)
  std::uint16_t store_port = 0;
  std::vector<NodeInfo> nodes;  // by group rank
};

// How a round ended.
struct RoundOutcome {
  int round = 0;
  std::optional<RoundEnd> end;  // why, the same on every node
  std::string error;            // no `end`: the rendezvous was lost or sent a malformed record
};

// Runs a function on the agent's loop thread.
using Post = std::function<void(std::function<void()>)>;

class Rendezvous {
 public:
  struct Listener {
    virtual ~Listener() = default;
    virtual void on_round_ready(const RoundInfo& info) = 0;
    // The rendezvous cannot go on (a time-out, a bad configuration, the job stopped elsewhere):
    // the job ends with `exit_code`.
    virtual void on_rendezvous_failed(const std::string& message, int exit_code) = 0;
    virtual void on_round_over(const RoundOutcome& outcome) = 0;
    virtual void on_finished() = 0;
  };

  virtual ~Rendezvous() = default;
  virtual void set_listener(Listener& listener) = 0;
  // For the log: where and how nodes meet ("127.0.0.1:29400 (c10d, 2 to 4 nodes)"); empty for one node.
  virtual std::string describe() const = 0;

  // Joins round `round` with this node's restart count (-1: a node new to the job).
  virtual void join(int round, int restart_count) = 0;
  // Ends round `round` for every node, unless another node ended it first. `expect_next`: how
  // many nodes the next round waits for before closing without a last call (0: no hint).
  virtual void end_round(int round, const RoundEnd& why, int expect_next) = 0;
  // Every worker of this node exited 0; the round ends "success" once every node says so.
  virtual void report_success(int round) = 0;
  // The job ends after round `round`: acknowledge its end (when `acknowledge`), so that the node
  // hosting the store keeps it until the others have read the end (bounded); then on_finished.
  virtual void finish(int round, bool acknowledge) = 0;
  // A stop signal while no round runs here: the nodes in (or on their way to) round `round` are
  // told; then on_finished.
  virtual void leave(int round, int signal) = 0;
  // Stops what runs in the background; waits a bounded time (one thread stuck on an unreachable
  // store is left behind: it touches nothing but state it shares).
  virtual void shutdown() = 0;
};

}  // namespace ddprun::agent
