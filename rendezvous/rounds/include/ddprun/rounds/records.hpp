#pragma once
// The records nodes exchange about a round, with their JSON conversion in both directions: how
// a node describes itself (NodeInfo), why a round ended (RoundEnd), a failed worker as the
// other nodes see it (FailureRecord), and the job's crash-loop streak (Streak).
//
// Anything can be written where a record is read (a bug, another program, a hostile client of an
// unsecured store): a value that is not JSON, not an object, truncated, or has a field of the
// wrong type is a ProtocolError naming the key and the field, never an uncaught exception.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/common/exit_status.hpp"

namespace ddprun::rounds {

// What a node offers the round of the workers' in-memory state as it arrives (docs/usage.md,
// "State across nodes"): where its state link serves copies ("host:port"; empty: none), and
// whether it holds any state. In its record as "state_link" and "holds_state".
struct StateOffer {
  std::string link;
  bool holds = false;
};

// A node of a round, as it described itself on arrival.
struct NodeInfo {
  std::string host;                // its name in messages: --local_addr, else its host name
  std::string addr;                // --local_addr (empty when not given)
  std::string reach;               // the address it reaches the rendezvous from
  int nproc = 1;
  int node_rank = -1;
  std::vector<std::string> addrs;  // its interface addresses (its workers connect from one)
  // The last round this node ran in (since its launch) and its group rank there: the assigner
  // keeps it in that place (docs/rounds-protocol.md, "Running a round"). -1: none.
  int last_round = -1;
  int last_rank = -1;
  StateOffer state;  // the workers' in-memory state it offers the round (above)
};

// A worker that failed: the root cause of a round's end, as every node reports it.
struct FailureRecord {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  ExitStatus status;
  std::chrono::system_clock::time_point time;
  std::string host;
  std::string reason;      // "exit code 3", "no heartbeat for 2.0 s", ...
  int exit_code = 1;       // what ddprun exits with if this is the root cause
  bool hang = false;       // it missed its heartbeats (then every node dumps its workers' stacks)
  double silent_s = 0;     // hang: seconds since its last heartbeat (or its start) when found hung
  std::string error_file;  // TORCHELASTIC_ERROR_FILE, if the worker wrote it
  std::string message;     // from the error file
  std::string traceback;   // from the error file
  std::deque<std::string> stderr_tail;
};

// Why a round ended: the first node to say so decides, for every node.
struct RoundEnd {
  enum class Kind { failure, node_lost, membership, stopped, success };
  Kind kind = Kind::success;
  std::string host = "?";  // failure: the failed rank's host; node_lost: the lost node; stopped, membership: who
  int group_rank = -1;     // node_lost
  double idle_s = 0;       // node_lost: seconds without a sign of life, as its watcher measured them
  // When the cause began, on the writer's wall clock (epoch: unknown). node_lost: the lost node's
  // last sign of life as its watcher saw it; membership: when the new node asked to join.
  std::chrono::system_clock::time_point since{};
  int signal = 0;          // stopped
  std::string by;          // stopped: the id of the node that stopped it
  std::optional<FailureRecord> failure;  // failure: the root cause

  static RoundEnd of_failure(FailureRecord f);
  static RoundEnd of_stop(int signal, std::string host, std::string by);
  static RoundEnd of_node_lost(int group_rank, std::string host, double idle_s,
                               std::chrono::system_clock::time_point since = std::chrono::system_clock::time_point{});
  static RoundEnd of_membership(std::string host,
                                std::chrono::system_clock::time_point since = std::chrono::system_clock::time_point{});
  static RoundEnd of_success();
};

const char* to_string(RoundEnd::Kind k);

// The job's failures round after round (--max_same_failures): how many failed rounds in a row
// had the same root cause (the same rank failing the same way: a crash loop), and how many in a
// row failed on the same host. A round carries the streak its members brought (first writer
// wins, read back by every member), and every member computes the next one from it and the
// round's end: every member of a round reaches the same crash-loop verdict.
struct Streak {
  std::string cause;  // the last root cause: rank, hang, signal, exit code ("" before any failure)
  int same = 0;       // consecutive failed rounds with that root cause
  std::string host;   // the last root cause's host
  int host_same = 0;  // consecutive failed rounds whose root cause was on that host

  // The streak after a round whose root cause was `f`.
  Streak after(const FailureRecord& f) const;
  bool operator==(const Streak&) const = default;
};

// The restart policy: what a member decides when its round ended in a failure, from what every
// member of the round read alike (the round's streak and restart count, the end's root cause),
// so that all reach the same verdict. A crash loop first (--max_same_failures failed rounds in a
// row with the same root cause; 0 or less: never), then no restart left (--max_restarts; below
// 0: unlimited), else a restart.
struct AfterFailure {
  enum class Verdict { restart, crash_loop, no_restart_left };
  Streak streak;  // what the next round is joined with
  Verdict verdict = Verdict::restart;
};
AfterFailure after_failure(const Streak& round_streak, const FailureRecord& root_cause, int restart_count,
                           int max_restarts, int max_same_failures);

// Writers and readers. Readers throw
// ddprun::ProtocolError("rendezvous: malformed value at key 'KEY': ...").
std::string node_json(const NodeInfo& n);
NodeInfo parse_node(const std::string& key, const std::string& value);
std::string round_end_json(const RoundEnd& e);
RoundEnd parse_round_end(const std::string& key, const std::string& value);
std::string streak_json(const Streak& s);
Streak parse_streak(const std::string& key, const std::string& value);

}  // namespace ddprun::rounds
