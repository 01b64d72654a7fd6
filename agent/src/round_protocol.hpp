#pragma once
// The round protocol agents speak through the rendezvous store: the key layout and every record
// with its JSON conversion, both directions, in this one place.
//
// Keys, under "ddprun/rdzv/<run_id>/":
//   round              the latest round any agent joined
//   r<R>/rc            the restart count of round R
//   r<R>/expect        how many nodes round R expects (survivors of round R-1); it closes as soon
//                      as they are in, instead of waiting out the last call
//   r<R>/join          arrival counter: arrival order = group rank (c10d)
//   r<R>/node/<i>      NodeInfo of the i-th arrival
//   r<R>/closed        K, the number of nodes in round R (the first K arrivals); "stopped" when a
//                      node was stopped by a signal during the rendezvous
//   r<R>/store         port of the workers' store, published by the hosting agent after emptying
//                      it for round R
//   r<R>/alive/<g>     keep-alive counter of group rank g
//   r<R>/end           RoundEnd: why round R ended (the first writer wins)
//   r<R>/succeeded, r<R>/acked, r<R>/all_acked   the end of a successful or finished job
//   r<R>/stop_acks, r<R>/stop_seen               nodes that read a "stopped" end
//
// Anything can be written into the store (a bug, another program, a hostile client of an
// unsecured store): a value that is not JSON, not an object, truncated, or has a field of the
// wrong type is a ProtocolError naming the key and the field, never an uncaught exception.

#include <optional>
#include <string>
#include <vector>

#include "failure_report.hpp"

namespace ddprun::agent {

// A random id for this agent, unique among the nodes of a job (several may share a host name):
// it signs the "stopped" ends it writes.
std::string random_node_id();

// The key of `name` in round `round`, relative to the run's prefix: "r3/end".
std::string round_key(int round, const std::string& name);

// r<R>/node/<i>: the i-th node to arrive in round R.
struct NodeInfo {
  std::string host;
  std::string addr;
  int nproc = 1;
  int node_rank = -1;
  std::vector<std::string> addrs;  // the node's interface addresses (its workers connect from one)
};

// r<R>/end: why a round ended.
struct RoundEnd {
  enum class Kind { failure, node_lost, membership, stopped, success };
  Kind kind = Kind::success;
  std::string host = "?";  // failure: the failed rank's host; node_lost: the lost node; stopped, membership: who
  int group_rank = -1;     // node_lost
  double idle_s = 0;       // node_lost: seconds without a keep-alive
  int signal = 0;          // stopped
  std::string by;          // stopped: the id of the node that stopped it (Coordinator::node_id)
  std::optional<FailureRecord> failure;  // failure: the root cause

  static RoundEnd of_failure(FailureRecord f);
  static RoundEnd of_stop(int signal, std::string host, std::string by);
  static RoundEnd of_node_lost(int group_rank, std::string host, double idle_s);
  static RoundEnd of_membership(std::string host);
  static RoundEnd of_success();
};

const char* to_string(RoundEnd::Kind k);

// Writers and readers. Readers throw
// ddprun::ProtocolError("rendezvous: malformed value at key 'KEY': ...").
std::string node_json(const NodeInfo& n);
NodeInfo parse_node(const std::string& key, const std::string& value);
std::string round_end_json(const RoundEnd& e);
RoundEnd parse_round_end(const std::string& key, const std::string& value);

}  // namespace ddprun::agent
