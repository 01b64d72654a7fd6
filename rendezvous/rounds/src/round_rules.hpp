#pragma once
// The round rules, written once over the Backend seam (keys: keys.hpp): rounds of MIN:MAX nodes
// closed when full, when every survivor of the last round is back, or when the last call is
// over; static node ranks claimed first-writer-wins; one restart count per round; a late node
// asks the running round to end ("membership") when it has room; the workers' store published
// by group rank 0; the end of a round decided by its first writer; acknowledgements so that a
// node holding the records keeps them until the others have read the end; stops announced to
// nodes still in the rendezvous.
//
// Blocking, and not thread-safe: the rendezvous calls join/end/report/acknowledge from its
// coordinator thread only; announce_stop and wait_end take a connection of their caller's own.
// Errors that end the rendezvous are RendezvousErrors (rendezvous_error.hpp); a backend that
// cannot be reached throws its own ddprun::Error.
//
// One class in four files, one a part of docs/rounds-protocol.md's rules: round_rules.cpp
// (connecting, joining, closing, running and ending a round), round_rules_assign.cpp (the
// assignment: the members' places), round_rules_outside.cpp (waiting for a place, static rank
// claims) and round_rules_stop.cpp (stopping during the rendezvous). One state, since every part
// acts on the node's one connection, its record and what it told a stop (told_).

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "backend.hpp"
#include "ddprun/rounds/options.hpp"
#include "ddprun/rounds/rendezvous.hpp"
#include "round_state.hpp"

namespace ddprun::rounds {

class WorkersStore;

// This node, as the other nodes see it.
struct Self {
  std::string node_id;  // random, unique among the nodes of a job (several may share a host)
  NodeInfo info;
};
// A new node id, and this node's description (host name or --local_addr, its addresses).
Self describe_self(const RendezvousOptions& opt, const std::string& reach);

class RoundRules {
 public:
  // `time`: the rules' clock (the simulator's virtual time; TimeSource::real() otherwise).
  RoundRules(const RendezvousOptions& opt, Backend& backend, WorkersStore& workers, Self self,
             const TimeSource& time = TimeSource::real());

  // Opens this node's connection and checks the run: a run id used by a job with other settings,
  // or a finished one, is an error naming it.
  void connect();

  struct Joined {
    RoundInfo info;
    Members members;
  };
  // Joins round `round` (or a later one when this node does not fit in it). `restart_count` is
  // this node's count, or -1 for a node new to the job; `streak` its crash-loop streak (not
  // written by a node new to the job). Throws RendezvousError: too few nodes
  // within join_timeout, a node rank in use, a node stopped during the rendezvous.
  Joined join(int round, int restart_count, const Streak& streak = {}, const StateOffer& state = {});

  // Ends the round with `why` unless another node ended it first. expect_next > 0: how many
  // nodes the next round waits for before closing without a last call.
  void end_round(int round, RoundEnd why, int expect_next);
  // This node's workers all exited 0; the last node to report ends the round "success".
  void report_success(int round, int group_world);
  // After the end: every node acknowledges; the last one clears the run and marks it finished;
  // a node holding the records waits (bounded) for every acknowledgement.
  // `succeeded`: the round ended "success" (the marker says so: a node waiting outside the job
  // then exits 0).
  void acknowledge_end(int round, int group_world, bool succeeded = false);

  // A stop signal while this node joins `round`: ends it "stopped" and wakes every node waiting
  // in its rendezvous. A node holding the records keeps them until the others have read why
  // (1.5 s at most; 0.3 s when no other node had joined).
  void announce_stop(Connection& c, int round, int signal);
  // Round `round`'s end, waited for until `deadline`; nullopt when it has none yet. A member
  // away (paused) while the others ended the job can find its round's records cleared (etcd):
  // at the deadline the finished marker is looked at, and a job finished in this round or later
  // throws RendezvousError (finished), instead of a wait that never ends.
  std::optional<RoundEnd> end_by(Connection& c, int round, Clock::time_point deadline);
  // Blocks until round `round` has an end, and returns it (end_by, a liveness TTL at a time).
  RoundEnd wait_end(Connection& c, int round);

  // The round a stop signal should be announced to, when the caller was asked for `asked`: the
  // round this node arrived in (the others may wait for it there), or -1 when it is in none
  // that could wait for it (it waits for a place beside a running round; static: it holds no
  // node rank, its claim pending or refused). Any thread.
  int round_to_tell(int asked) const;

  // Called (on the joining thread) each time this node starts waiting for a place.
  void on_waiting(std::function<void()> f) { on_waiting_ = std::move(f); }

  const std::string& node_id() const { return self_.node_id; }
  const std::string& where() const { return where_; }

 private:
  // A member of a closed round that never came to run it (died while joining): the round is
  // given up (enter_round), an outcome the reads below return, not an error.
  struct MemberGone {
    int index;
    std::string host;
    std::string what;
  };

  // What claim_rank saw of a counter the holder of its rank bumps (`held`, or its keep-alive).
  struct HolderWatch {
    Key counter;
    long long count = -1;
    Clock::time_point alive_at{};   // when the count was seen to change (the first look included)
    Clock::time_point looked_at{};  // the last look
  };
  int latest_round(int from);
  bool claim_rank(int round, Clock::time_point deadline);
  bool moved(HolderWatch& w);
  bool holder_gone(int round, const HolderWatch& w);
  [[noreturn]] void throw_held(int round, const std::string& host, const std::string& alive);
  bool members_gone(int round);
  int wait_closed(int round, int idx, Clock::time_point deadline);
  bool wait_for_others(Connection& c, int round, Clock::time_point deadline, bool look);
  void say_waiting(Connection& c, int round, Clock::time_point deadline);
  bool close_after_last_call(Connection& c, int round, std::int64_t joined_now);
  void wait_next_round(int round, int closed);
  bool ended_without_count(Connection& c, int round);
  [[noreturn]] void throw_finished(const char* while_ = "waited for a place in it");
  bool stopped_before_run(Connection& c, int round);
  std::string existing(Connection& c, const Key& k);
  std::optional<FinishedMark> finished_mark(Connection& c);
  bool finished_since(Connection& c, int round);
  void throw_if_finished(Connection& c, int round, const char* while_ = "waited for a place in it");
  void throw_if_job_finished();
  std::optional<Joined> enter_round(int round, int idx, int closed);
  // What assign() leaves this node: its assignment as it stands, and the records by group rank
  // (none when refused); or a member gone.
  struct Placed {
    std::string mine;
    std::vector<NodeInfo> nodes;
    std::optional<MemberGone> gone;
  };
  // The round's records in arrival order; or the first member whose record is missing.
  struct Arrivals {
    std::vector<NodeInfo> nodes;
    std::optional<MemberGone> gone;
  };
  Arrivals read_arrivals(int round, int closed, bool at_once = false, bool assigned = false);
  std::string order_members(const std::vector<NodeInfo>& arrivals, std::vector<NodeInfo>& nodes,
                            std::vector<int>& order) const;
  struct Seat {
    int arrival = -1, group_rank = -1;
    std::string host = "?";
  };
  Seat lineup_seat(int round, int closed, int arrival);
  Placed assign(int round, int idx, int closed, bool stand_in);
  Placed own_assignment(int round, int idx, int closed);
  std::variant<Joined, MemberGone> read_round(int round, int idx, int closed);
  std::optional<MemberGone> publish_store(Joined& j);
  // `member`: this node arrived in the round (it acknowledges a stop); false for a claimer.
  void throw_if_stopped(Connection& c, int round, bool member = true);
  [[noreturn]] void throw_stop(int signal, const std::string& host, const std::string& then);
  [[noreturn]] void throw_stopped(Connection& c, int round, bool member = true);
  [[noreturn]] void throw_closed_stopped(Connection& c, int round, bool member = true);
  void ask_to_join(int round, int closed);

  const RendezvousOptions& opt_;
  Backend& backend_;
  const TimeSource& time_;
  WorkersStore& workers_;
  Self self_;
  std::string where_;
  std::unique_ptr<Connection> conn_;
  bool said_standby_ = false;
  std::function<void()> on_waiting_;
  int first_round_ = 0;  // a relaunch of a finished run id meets after the old job's rounds
  static constexpr int kNobody = -2;
  // The round this node arrived in (static: or holds its rank in, before it arrives); -1: none
  // yet; kNobody: excluded from it (beyond its nodes, or refused its static rank).
  std::atomic<int> told_{-1};
  std::atomic<int> told_idx_{-1};  // its arrival index there (-1: not arrived yet)
};

}  // namespace ddprun::rounds
