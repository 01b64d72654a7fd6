#pragma once
// State follows the rank (docs/usage.md: State across nodes). Before a round's workers start,
// each agent compares the rank each of its areas holds with the rank it now has: an area whose
// rank moved (a node keeps its group rank at a restart, but members come and go), or any area of
// a node that sat the last round out, is kept aside as a copy (served to the node that now has
// that rank) and emptied; every agent that said as it joined the round that it holds state
// publishes which ranks it holds (the newest holder of each, and another); an agent whose area
// lacks its rank's state waits until every such member has published, then fetches it into the
// area. A round in which no member holds state touches no store here. A rank whose node and buddy
// were both lost starts without state, and ddprun.state.load() says so on every rank.
//
// Used by StateCopies on its thread (workers/state_copies.hpp): not thread-safe, but holds() and
// here(), which any thread may call.

#include <functional>
#include <string>
#include <vector>

#include "ddprun/rounds/rendezvous.hpp"

namespace ddprun::rendezvous {
class TcpStore;
}

namespace ddprun::agent {

class StateAreas;
class StateLinkServer;

class StatePlacement {
 public:
  // `server`: where this node keeps the copies it serves (the ranks' states kept aside, its
  // buddy's); `host`: how the other nodes reach this one.
  StatePlacement(const StateAreas& areas, StateLinkServer& server, std::string host);

  // A round's keys in its workers' store (`prefix`: "ddprun/state/R/"), its copy key and its
  // workers' store (each asked for where first needed), and `wanted`: false once the round is
  // over (a wait is cut short).
  struct RoundKeys {
    std::string prefix;
    std::function<std::string()> key;
    std::function<rendezvous::TcpStore&()> store;
    std::function<bool()> wanted;
    std::string at(const std::string& what) const { return prefix + what; }
  };
  // Puts each area's state in place for its rank in round `info`: kept where this node ran the
  // same rank in the round before (settled whole), else kept aside and fetched from the newest
  // holder. Throws ddprun::Error (a rank's state then starts empty; the next round looks again).
  void settle(const rounds::RoundInfo& info, const RoundKeys& keys);
  // Whether this node holds any state (an area's, a copy): what it says as it joins a round.
  bool holds() const;
  std::string here() const;  // this node's "host:port" of copies
  // This node sent state in this job (a copy to its buddy): a later round looks for its ranks'.
  void saw_state() { seen_state_ = true; }
  bool seen_state() const { return seen_state_; }

 private:
  void publish(const rounds::RoundInfo& info, const RoundKeys& keys);
  // Until every member that holds state has published what it holds; false: the round is over first.
  bool wait_all(const rounds::RoundInfo& info, const RoundKeys& keys);
  // True where the rank's state is in place, or no node holds it; false where a holder failed.
  bool fetch(const rounds::RoundInfo& info, const RoundKeys& keys, int local_rank, std::uint64_t slot_bytes);

  const StateAreas& areas_;
  StateLinkServer& server_;
  const std::string host_;
  std::vector<int> area_rank_;  // the rank whose state each area holds
  int settled_round_ = -1;      // the last round whose every area's state was put in place
  bool seen_state_ = false;     // this node has held, sent or fetched state in this job
};

}  // namespace ddprun::agent
