#pragma once
// The records only the round protocol itself reads (records.hpp has those that cross the
// Rendezvous seam), each with its JSON in both directions. Readers throw ProtocolError naming
// the key.

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/rounds/options.hpp"

namespace ddprun::rounds {

// r<R>/closed: who is in round R, or that a stop ended it first.
struct Closed {
  enum class Kind { nodes, stopped, abandoned };
  Kind kind = Kind::nodes;
  int nodes = 0;  // the first `nodes` arrivals are the round
  int rank = -1;  // abandoned: the static rank whose holder died in (or gave up on) the round before
                  // it closed; c10d, etcd: the arrival whose join timed out in it

  static Closed of_nodes(int n) { return {Kind::nodes, n}; }
  static Closed stopped() { return {Kind::stopped, 0}; }
  static Closed abandoned(int rank) { return {Kind::abandoned, 0, rank}; }
};
std::string closed_json(const Closed& c);
Closed parse_closed(const std::string& key, const std::string& value);

// r<R>/store: the workers' store (MASTER_ADDR, MASTER_PORT), or a stop, or that a member gave
// the round up before it ran (`gone`: the arrival index of the member it counted lost).
struct StoreAddress {
  std::string host;
  std::uint16_t port = 0;
  bool stopped = false;
  int gone = -1;
};
std::string store_json(const StoreAddress& s);
StoreAddress parse_store(const std::string& key, const std::string& value);

// r<R>/assign/<i>: the i-th arrival's place in round R, computed for every member by one node
// from the members' records. `rc` is r<R>/rc's text as it stood ("finished": the job ended
// before the round). `refused`: the records cannot make a round (a static node rank out of
// range or used twice): every member fails with that message. `stopped`: a member was stopped
// before the round ran (written by it, first writer wins, to wake the members waiting for theirs).
// All a member reads of the round (O(1) bytes, whatever its size): the others' records and
// hosts stay in r<R>/node/<i> and r<R>/members.
struct Assignment {
  int group_rank = 0;
  int offset = 0;  // the sum of nproc over the group ranks below
  int world = 0;   // the sum of nproc over the members
  // The member after this one (group rank + 1, mod the round's size), which this one watches
  // (the keep-alive ring; etcd: its record): its arrival index and its host (for messages).
  int next = 0;
  std::string next_host;
  // The workers' in-memory state: the next member's state link (where this one's copies go;
  // empty: none), and how many members hold state as they arrive (who to wait for before a rank's
  // state is looked for elsewhere).
  std::string next_link;
  int holders = 0;
  std::string rc;
  std::string streak;  // Streak's JSON (records.hpp)
  std::string refused;
  bool stopped = false;
};
std::string assignment_json(const Assignment& a);
Assignment parse_assignment(const std::string& key, const std::string& value);

// r<R>/members: the members' hosts and arrival indices, by group rank. Written with the
// assignments; read by no member on a round's way (each reads its own assignment), only for a
// host to name when a member is lost (lineup_seat) and by whoever inspects a round.
struct Lineup {
  std::vector<std::string> hosts;
  std::vector<int> arrivals;
};
std::string lineup_json(const Lineup& l);
// `members`: the round's size (each list holds that many entries).
Lineup parse_lineup(const std::string& key, const std::string& value, int members);

// config: the settings every node of a job shares.
// The round records' version: a node reading records of another one would misread them (1: no
// field, before the crash-loop streak, the given-up and abandoned marks, the held counters; 2:
// before the assignments, when every member read every member's record; 3: before the ring's
// next member in the assignment, when every member read r<R>/members; 4: before the records'
// last_round and last_rank, when the assigner ranked the members by arrival: two versions would
// place them differently; 5: before the records' state_link and holds_state, when every member
// said in the workers' store where its copies go, and every member waited for every other).
constexpr int kRoundProtocol = 6;

struct RunConfig {
  BackendKind backend = BackendKind::c10d;
  int min_nodes = 1;
  int max_nodes = 1;
  int protocol = kRoundProtocol;
  // What else every node of a job must share, where recorded (-1: not, as in records of this
  // version written before these fields): the keep-alives by which a store backend's nodes judge
  // each other lost (each by its own: a node that beats slower than another judges is lost over
  // and over), and the restart policy every member applies alike to a failed round.
  long long keep_alive_ms = -1;
  int keep_alive_attempts = -1;
  int max_restarts = -1, max_same_failures = -1;  // (-1 also: unlimited, never; see the JSON)
  bool restart_policy = false;                    // max_restarts and max_same_failures recorded
  bool operator==(const RunConfig& o) const {
    return backend == o.backend && min_nodes == o.min_nodes && max_nodes == o.max_nodes && protocol == o.protocol;
  }
  std::string describe() const;  // "c10d, 2 to 4 nodes"
  // How `mine` differs from this standing config, as "X; this node: Y" parts; "" when alike
  // (a field one of them does not record is alike).
  std::string differences(const RunConfig& mine) const;
};
std::string config_json(const RunConfig& c);
RunConfig parse_config(const std::string& key, const std::string& value);

// r<R>/rank/<n>: the node holding a static node rank.
struct RankClaim {
  std::string node_id;
  std::string host;
};
std::string claim_json(const RankClaim& c);
RankClaim parse_claim(const std::string& key, const std::string& value);

// finished: the job ended with round `round`, at wall-clock time `at_ms` (ms since the epoch).
struct FinishedMark {
  int round = -1;
  long long at_ms = 0;
  bool succeeded = false;  // its last round ended "success" (every worker exited 0)
  int signal = 0;          // stopped before its round ran: the signal, and the host that got it
  std::string host = "";
};
std::string finished_json(const FinishedMark& f);
// "1" (written by an older ddprun) reads as a job that finished just now, in round -1.
FinishedMark parse_finished(const std::string& key, const std::string& value, long long now_ms);

// A counter or a number written by a node (round, rc, expect): a decimal integer in [lo, hi].
long long parse_number(const std::string& key, const std::string& value, long long lo, long long hi);

}  // namespace ddprun::rounds
