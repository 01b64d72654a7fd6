#pragma once
// The keys of a run, relative to its prefix ("ddprun/rdzv/<run_id>" in a store,
// "<etcd prefix>/<run_id>" in etcd). Typed: a key is built from its name, never parsed back.
//
// Run-wide:
//   config             RunConfig of the first node: a node whose settings differ is another job
//                      (a relaunch's is r<F>/config, F its first round)
//   finished           the job ended (a node arriving later is told so)
// Round R (r<R>/...):
//   rc                 the restart count of round R (first writer wins)
//   streak             Streak: the crash-loop streak of round R (first writer wins; a member
//                      reads it with a create, so that nobody can write it after)
//   expect             how many nodes round R expects (survivors of R-1): it closes as soon as
//                      they are in, instead of waiting out the last call (first writer wins:
//                      the node that ended R-1 writes it before the end)
//   join               arrival counter: the arrival index (c10d, etcd: a member keeps the group
//                      rank it last ran with, newcomers take free ones in arrival order)
//   node/<i>           NodeInfo of the i-th arrival (etcd: on the node's lease)
//   rank/<n>           static: the node holding --node_rank n (first writer wins)
//   held/<n>           static: counter the holder of rank n bumps while it waits for round R to
//                      close (a store has no other sign of its life before a round runs)
//   closed             Closed: the first K arrivals are the round; or stopped; or abandoned (a
//                      static rank's holder died in it before it closed, or a node's join timed
//                      out in it: meet in the next)
//   members            Lineup: the members' hosts and arrival indices by group rank (written
//                      with the assignments, by the round's last member, or first writer wins)
//   assign/<i>         Assignment of the i-th arrival: its group rank, rank offset, the world
//                      size, the round's restart count and streak, the ring's next member (one
//                      writer computes them all; all a member reads of the round)
//   store              StoreAddress of the workers' store, published by group rank 0; or a stop,
//                      or a member giving the round up before it ran (first writer wins)
//   alive/<g>          keep-alive counter of group rank g (store backend); static: a node claiming
//                      rank g reads it too (it moving: the rank's holder is alive)
//   end                RoundEnd: why round R ended (first writer wins)
//   succeeded, acked, all_acked      the end of a successful or finished job
//   stop_acks, stop_seen             nodes that read a "stopped" end

#include <string>

namespace ddprun::rounds {

enum class Name {
  config, finished,
  rc, streak, expect, join, node, rank, held, closed, members, assign, store, alive, end, succeeded, acked, all_acked, stop_acks, stop_seen,
};

struct Key {
  Name name;
  int round = -1;  // -1: a run-wide key
  int index = -1;  // node/<i>, rank/<n>, held/<n>, assign/<i>, alive/<g>

  // The key relative to the run's prefix: "r3/node/1", "config".
  std::string text() const;
  // The prefix of every key of this kind in this round ("r3/node/"): for watching them all.
  std::string family() const;
  bool operator==(const Key& o) const { return name == o.name && round == o.round && index == o.index; }
};

inline Key run_key(Name n) { return Key{n, -1, -1}; }
inline Key round_key(int round, Name n, int index = -1) { return Key{n, round, index}; }

}  // namespace ddprun::rounds
