#pragma once
// EtcdRendezvous's state, shared by etcd_rendezvous.cpp (lease, watch, end of rounds, threads)
// and etcd_join.cpp (joining a round). Private to the agent.

#include "etcd_rendezvous.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <spdlog/spdlog.h>

#include "rendezvous_threads.hpp"
#include "coordinator.hpp"  // JobStopped
#include "ddprun/agent/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "etcd_client.hpp"

namespace ddprun::agent {

struct EtcdRendezvous::Core : std::enable_shared_from_this<Core> {
  RendezvousOptions opt;
  std::vector<EtcdEndpoint> endpoints;
  std::string prefix, node_id = random_node_id();
  int nproc;
  Post post;
  Listener* listener = nullptr;

  TaskQueue tasks;
  RoundEnds ended;
  std::atomic<std::int64_t> lease{0};
  std::atomic<int> current_round{0};  // the round this node is in (or joining)

  // Coordinator thread only.
  std::unique_ptr<EtcdClient> etcd;
  int group_world = 1;
  std::unique_ptr<rendezvous::StoreServer> worker_store;

  BoundedThread thread, watcher, keeper, announcer;

  Core(const RendezvousOptions& o, const std::string& run_id, int n, Post p)
      : opt(o), endpoints(parse_etcd_endpoints(o.etcd_endpoints)), prefix(o.etcd_prefix + "/" + run_id), nproc(n),
        post(std::move(p)) {}

  std::unique_ptr<EtcdClient> client() const;
  std::string key(int round, const std::string& name) const { return prefix + "/" + round_key(round, name); }
  std::string where() const { return opt.etcd_endpoints; }

  void run();

  void over(RoundOutcome o);

  // ---- the lease: this node's liveness -------------------------------------------------------

  void start_lease();

  void keep_alive();

  // ---- joining a round -------------------------------------------------------------------------

  void throw_if_stopped(int round);

  // The members of round `round` once it is closed (closing it when this arrival fills it or the
  // last call is over); throws TimeoutError when too few nodes join in time.
  std::vector<std::string> wait_closed(int round, std::chrono::steady_clock::time_point deadline);

  RoundInfo read_round(int round, const std::vector<std::string>& members, int rc);

  // The workers' store: hosted by group rank 0 of the round, emptied, published.
  void publish_store(RoundInfo& info);

  void do_join(int round, int rc);

  // ---- the end of a round ------------------------------------------------------------------------

  // Waits for round `info.round` to end; a member whose key vanishes (its lease expired) is lost.
  void watch(const RoundInfo& info, const std::vector<std::string>& members);

  void watch_round(const RoundInfo& info, const std::vector<std::string>& members, std::int64_t from);

  void guarded(int round, const std::function<void()>& f);

  void end_round(int round, RoundEnd why, int expect_next);

  void report_success(int round);

  // The job is over here. The last node to acknowledge deletes the run's keys; this node's lease
  // goes (its join keys with it).
  void finish(int round, bool acknowledge);
};

}  // namespace ddprun::agent
