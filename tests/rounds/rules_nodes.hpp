#pragma once
// Several nodes (ThreadedRendezvous, each with its threads) meeting through an in-memory backend,
// for the round rules' tests (rules_test.cpp, static_rules_test.cpp).
#include <catch2/catch.hpp>

#include "fake_backend.hpp"
#include "recorder.hpp"
#include "round_rules.hpp"
#include "threaded_rendezvous.hpp"
#include "workers_store.hpp"

namespace ddprun::rounds::testing {

struct Nodes {
  std::shared_ptr<FakeWorld> world = std::make_shared<FakeWorld>();
  RendezvousOptions opt;
  std::vector<std::unique_ptr<Recorder>> rec;
  std::vector<std::unique_ptr<ThreadedRendezvous>> nodes;

  Nodes(int min_nodes, int max_nodes, BackendKind kind = BackendKind::c10d) {
    opt.backend = kind;
    opt.run_id = "job";
    opt.min_nodes = min_nodes;
    opt.max_nodes = max_nodes;
    opt.nproc = 2;
    opt.join_timeout = 10s;
    opt.last_call_timeout = 200ms;
    opt.read_timeout = 5s;
  }
  // A new node; returns its index.
  int add(int node_rank = 0, const std::function<void(RendezvousOptions&)>& tweak = {}) {
    auto o = opt;
    o.node_rank = node_rank;
    if (tweak) tweak(o);
    rec.push_back(std::make_unique<Recorder>());
    Recorder* r = rec.back().get();
    nodes.push_back(std::make_unique<ThreadedRendezvous>(
        o, [&](std::weak_ptr<Renewals> rn) { return std::make_unique<FakeBackend>(world, std::move(rn)); }, inline_post(),
        r));
    nodes.back()->set_listener(*r);
    return static_cast<int>(nodes.size()) - 1;
  }
  void add_many(int n) {
    for (int i = 0; i < n; ++i) add(i);
  }
  void join_all(int round, int rc) {
    for (auto& n : nodes) n->join(round, rc);
    for (auto& r : rec) REQUIRE(r->wait_ready());
  }
  // Nodes `who` join round `round` in that order: each once the one before it has arrived (its
  // record is written). `rc`: the restart count each brings (-1: a node new to the job).
  void join_in_order(int round, const std::vector<std::pair<int, int>>& who_rc) {
    int arrived = 0;
    for (auto [who, rc] : who_rc) {
      nodes[who]->join(round, rc);
      const std::string record = round_key(round, Name::node, arrived++).text();
      std::unique_lock<std::mutex> lk(world->mu);
      const bool came = world->cv.wait_for(lk, 10s, [&] { return world->kv.has(record); });
      lk.unlock();
      REQUIRE(came);
    }
  }
};

// A workers' store for RoundRules driven directly (no round is run).
struct NoStore : WorkersStore {
  NoStore() : WorkersStore("", 0) {}
  StoreAddress host(const RoundInfo&) override { return {}; }
  void release() override {}
};

}  // namespace ddprun::rounds::testing
