#pragma once
// The JSON records agents exchange through the rendezvous store, parsed with every field's type
// checked. Anything can be written into the store (a bug, another program, a hostile client of
// an unsecured store): a value that is not JSON, not an object, truncated, or has a field of the
// wrong type is a ProtocolError naming the key and the field, never an uncaught exception.

#include <optional>
#include <string>

#include "failure_report.hpp"

namespace ddprun::agent {

// r<R>/end: why a round ended.
struct RoundEnd {
  std::string kind;        // failure, node_lost, membership, stopped, success
  std::string host = "?";
  int group_rank = -1;     // node_lost
  int signal = 0;          // stopped
  std::string by;          // stopped: the id of the node that stopped it (Coordinator::node_id)
  std::optional<FailureRecord> failure;  // failure: the root cause
};

// Throws ddprun::ProtocolError("rendezvous: malformed value at key 'KEY': ...").
RoundEnd parse_round_end(const std::string& key, const std::string& value);
FailureRecord parse_failure(const std::string& key, const std::string& value);

}  // namespace ddprun::agent
