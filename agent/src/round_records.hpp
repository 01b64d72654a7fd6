#pragma once
// The JSON records agents exchange through the rendezvous store, parsed with every field's type
// checked. Anything can be written into the store (a bug, another program, a hostile client of
// an unsecured store): a value that is not JSON, not an object, truncated, or has a field of the
// wrong type is a ProtocolError naming the key and the field, never an uncaught exception.

#include <optional>
#include <string>
#include <vector>

#include "failure_report.hpp"

namespace ddprun::agent {

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
  std::string kind;        // failure, node_lost, membership, stopped, success
  std::string host = "?";
  int group_rank = -1;     // node_lost
  int signal = 0;          // stopped
  std::string by;          // stopped: the id of the node that stopped it (Coordinator::node_id)
  std::optional<FailureRecord> failure;  // failure: the root cause
};

// Writers and readers, each record's both directions here. Readers throw
// ddprun::ProtocolError("rendezvous: malformed value at key 'KEY': ...").
std::string node_json(const NodeInfo& n);
NodeInfo parse_node(const std::string& key, const std::string& value);
std::string failure_json(const FailureRecord& f);  // a round end of kind "failure"
std::string stopped_json(int signal, const std::string& host, const std::string& by);
RoundEnd parse_round_end(const std::string& key, const std::string& value);
FailureRecord parse_failure(const std::string& key, const std::string& value);

}  // namespace ddprun::agent
