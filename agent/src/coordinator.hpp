#pragma once
// Multi-node coordination of agents through the rendezvous store: rounds of rendezvous, the
// end of a round (a failure anywhere, a lost node, a node waiting to join, success everywhere),
// keep-alives. Every operation is a constant number of store requests per agent, so a round of
// N nodes costs O(N) requests, and every wait is a WAIT on a key (no polling).
//
// Keys, under "ddprun/rdzv/<run_id>/":
//   round              the latest round any agent joined
//   r<R>/rc            the restart count of round R
//   r<R>/expect        how many nodes round R expects (survivors of round R-1); it closes as soon
//                      as they are in, instead of waiting out the last call
//   r<R>/join          arrival counter: arrival order = group rank (c10d)
//   r<R>/node/<i>      JSON about the i-th arrival: host, address, nproc, node_rank
//   r<R>/closed        K, the number of nodes in round R (the first K arrivals)
//   r<R>/store         host:port of the workers' store, published by the hosting agent after
//                      emptying it for round R
//   r<R>/alive/<g>     keep-alive counter of group rank g
//   r<R>/end           JSON: why round R ended (kind: failure, node_lost, membership, stopped,
//                      success) and, for a failure, the root cause
//   r<R>/succeeded, r<R>/acked   counters for the end of a successful or finished job

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/agent/agent.hpp"
#include "ddprun/rendezvous/error.hpp"
#include "round_records.hpp"

namespace ddprun::rendezvous {
class Store;
class StoreServer;
}  // namespace ddprun::rendezvous

namespace ddprun::agent {


struct RoundInfo {
  int round = 0;
  int restart_count = 0;
  int group_rank = 0;
  int group_world = 1;
  int world_size = 1;
  int rank_offset = 0;  // RANK of this node's local rank 0
  std::string store_host;  // the workers' store (MASTER_ADDR:MASTER_PORT)
  std::uint16_t store_port = 0;
  std::vector<NodeInfo> nodes;  // by group rank
};

// Another node was stopped by a signal while this one was joining a round.
class JobStopped : public Error {
 public:
  JobStopped(int signal, const std::string& host)
      : Error("the job was stopped on host " + host), signal(signal), host(host) {}
  int signal;
  std::string host;
};

class Coordinator {
 public:
  // Hosts the rendezvous store (and the workers' store) when this agent is the host; connects
  // to the rendezvous store, retrying until join_timeout. Throws ddprun::Error.
  Coordinator(const RendezvousOptions& opt, const std::string& run_id, int nproc, int node_rank);
  ~Coordinator();

  bool is_host() const { return server_ != nullptr; }
  // A random id of this agent, unique among the nodes of a job (several may share a host name).
  const std::string& node_id() const { return node_id_; }
  // The store key of `name` in round `round`, as the store sees it (for error messages).
  std::string full_key(int round, const std::string& name) const;
  std::string endpoint() const;

  // Joins round `round` (or a later one when this node does not fit in it). `restart_count`
  // is this node's count, or -1 for a node that has not been in the job before. Blocking;
  // throws ddprun::TimeoutError when too few nodes join within join_timeout.
  RoundInfo join(int round, int restart_count);

  // Ends the round with `record` unless another agent ended it first; returns the record that
  // won (the same on every node). expect_next > 0: how many nodes the next round waits for
  // before closing without a last call.
  std::string end_round(int round, const std::string& record, int expect_next = 0);
  // Reports this node's workers all done; the last node to report ends the round "success".
  void report_success(int round, int group_world);
  // After the end: every agent acknowledges; the host waits (bounded) for all acknowledgements
  // before its store goes away.
  void acknowledge_end(int round, int group_world);

  // A stop signal while joining `round`: marks the round ended ("stopped", `record`) and wakes
  // every node waiting in its rendezvous, on a connection of its own (the joining one may be
  // blocked in a WAIT), within about a second. Throws ddprun::Error when the store is unreachable.
  void announce_stop(int round, const std::string& record);

  void keep_alive(int round, int group_rank);
  // The keep-alive counter of group rank g (-1 when it never sent one).
  long long alive_count(int round, int group_rank);

  // Calls on_end(record) from a background thread when round `round` ends, or on_end(nullopt)
  // if the rendezvous store is lost. One watch at a time.
  void watch(int round, std::function<void(std::optional<std::string>)> on_end);
  void stop_watch();

 private:
  std::shared_ptr<rendezvous::Store> connect(std::chrono::milliseconds timeout) const;
  // Throws JobStopped when round `round` was ended "stopped" (by a node's stop signal).
  void throw_if_stopped(rendezvous::Store& s, int round) const;
  bool decide_host() const;

  RendezvousOptions opt_;
  std::string prefix_;
  std::string node_id_;
  int nproc_;
  int node_rank_;
  std::unique_ptr<rendezvous::StoreServer> server_;        // rendezvous store (host only)
  std::unique_ptr<rendezvous::StoreServer> worker_store_;  // workers' store (host only)
  std::shared_ptr<rendezvous::Store> store_;
  std::thread watcher_;
  std::shared_ptr<rendezvous::Store> watch_store_;
};

}  // namespace ddprun::agent
