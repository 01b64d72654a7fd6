#pragma once
// The job's stragglers across nodes (README: Hangs, stragglers). A node sees only its own ranks'
// pace; with one rank a node, or a slow host, no node can tell its ranks from the others'. So at
// each pace window every node puts its ranks' busy shares in the workers' store, overwriting its
// entry, ddprun/pace/ROUND/node/GROUP_RANK = {"seq": N, "host": H, "busy": {"RANK": SHARE}},
// and the node of group rank 0 then reads every node's entry at once (one CHECK, one MULTI_GET)
// and hands on the ranks of the entries written since its last read, with their hosts, to be
// judged over the whole job (observe/pace_judge.hpp). Per node and window: one SET; group rank
// 0 alone reads the K entries. The whole job is judged only once
// every node has written (a node whose ranks never make steps leaves it to each node's own
// check). On the store queue (control/store_queue.hpp: one thread, a kept connection, at most
// 2 s a request), one window at a time (a window whose last one still waits is skipped); the
// result is posted to the loop.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct PaceSetup {
  std::string store_host;  // the workers' store
  std::uint16_t store_port = 0;
  int round = 0;
  int node = 0;   // this node's group rank
  int nodes = 1;  // the round's nodes
  std::string host;  // this node's name, for the message
};

// Rank -> (its host, its busy share), fresh from every node that wrote since the last read.
using JobPace = std::map<int, std::pair<std::string, double>>;

class StoreQueue;

class PaceExchange {
 public:
  using Done = std::function<void(JobPace)>;
  // `queue` outlives neither this nor the loop's handlers it posts (its owner ends it first).
  PaceExchange(boost::asio::io_context& io, StoreQueue& queue) : io_(io), queue_(queue) {}
  PaceExchange(const PaceExchange&) = delete;
  PaceExchange& operator=(const PaceExchange&) = delete;

  // Puts this node's window in; on group rank 0, `done` gets the job's (on the loop). A store
  // that cannot be reached costs this window only (a debug line).
  void window(const PaceSetup& s, const std::map<int, double>& busy, Done done);

 private:
  boost::asio::io_context& io_;
  StoreQueue& queue_;
  bool running_ = false;  // a window's request posted, its answer not yet back (the loop's)
  std::int64_t seq_ = 0;
  std::map<int, std::int64_t> read_seq_;  // group rank 0: each node's seq at the last read (the queue's)
};

}  // namespace ddprun::agent
