#pragma once
// The c10d round protocol over the rendezvous store (keys and records: round_protocol.hpp):
// rounds of rendezvous, the end of a round (a failure anywhere, a lost node, a node waiting to
// join, success everywhere), keep-alives. Every operation is a constant number of store requests
// per agent, so a round of N nodes costs O(N) requests, and every wait is a WAIT on a key (no
// polling). Blocking: StoreRendezvous calls it from its own threads, never from the agent's loop.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/agent.hpp"
#include "ddprun/common/error.hpp"
#include "rendezvous.hpp"
#include "round_protocol.hpp"

namespace ddprun::rendezvous {
class Store;
class StoreServer;
}  // namespace ddprun::rendezvous

namespace ddprun::agent {



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
  // Hosts the rendezvous store (and the workers' store) when this agent is the host. Fast: it
  // only binds; connect() reaches the store. Throws ddprun::Error.
  Coordinator(const RendezvousOptions& opt, const std::string& run_id, int nproc, int node_rank);
  ~Coordinator();

  // Connects to the rendezvous store, retrying until join_timeout. Throws ddprun::Error.
  void connect();
  bool is_host() const { return server_ != nullptr; }
  // A random id of this agent, unique among the nodes of a job (several may share a host name).
  const std::string& node_id() const { return node_id_; }
  // The store key of `name` in round `round`, as the store sees it (for error messages).
  std::string full_key(int round, const std::string& name) const;
  std::string endpoint() const;
  std::uint16_t endpoint_port() const { return opt_.endpoint_port; }

  // Joins round `round` (or a later one when this node does not fit in it). `restart_count`
  // is this node's count, or -1 for a node that has not been in the job before. Blocking;
  // throws ddprun::TimeoutError when too few nodes join within join_timeout, JobStopped when a
  // node was stopped during the rendezvous.
  RoundInfo join(int round, int restart_count);

  // Ends the round with `why` unless another agent ended it first (a "stopped" end is signed
  // with this node's id). expect_next > 0: how many nodes the next round waits for before
  // closing without a last call.
  void end_round(int round, RoundEnd why, int expect_next = 0);
  // Reports this node's workers all done; the last node to report ends the round "success".
  void report_success(int round, int group_world);
  // After the end: every agent acknowledges; the host waits (bounded) for all acknowledgements
  // before its store goes away.
  void acknowledge_end(int round, int group_world);

  // A stop signal while joining `round`: marks the round ended ("stopped") and wakes every node
  // waiting in its rendezvous, on a connection of its own (the joining one may be blocked in a
  // WAIT), within about a second. Throws ddprun::Error when the store is unreachable.
  void announce_stop(int round, int signal);

  void keep_alive(int round, int group_rank);
  // The keep-alive counter of group rank g (-1 when it never sent one).
  long long alive_count(int round, int group_rank);

  // A connection of its own for waiting on a round's end, and the wait itself (the raw record).
  std::shared_ptr<rendezvous::Store> connect_watch() const;
  std::string wait_end(rendezvous::Store& s, int round) const;

 private:
  std::shared_ptr<rendezvous::Store> connect(std::chrono::milliseconds timeout) const;
  // Throws JobStopped when round `round` was ended "stopped" (by a node's stop signal).
  void throw_if_stopped(rendezvous::Store& s, int round) const;
  bool decide_host() const;
  int wait_closed(rendezvous::Store& s, int round, int idx, std::chrono::steady_clock::time_point deadline);
  RoundInfo read_round(rendezvous::Store& s, int round, int idx, int closed, int restart_count);
  void publish_workers_store(rendezvous::Store& s, RoundInfo& info);

  RendezvousOptions opt_;
  std::string prefix_;
  std::string node_id_;
  int nproc_;
  int node_rank_;
  std::unique_ptr<rendezvous::StoreServer> server_;        // rendezvous store (host only)
  std::unique_ptr<rendezvous::StoreServer> worker_store_;  // workers' store (host only)
  std::shared_ptr<rendezvous::Store> store_;
};

}  // namespace ddprun::agent
