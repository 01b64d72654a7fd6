#pragma once
// An in-memory Backend: the round rules tested in-process, several nodes as threads, without a
// store or etcd. The test plays the backend's liveness (a member lost) and its failures.

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "backend.hpp"
#include "ddprun/common/error.hpp"
#include "memory_keys.hpp"

namespace ddprun::rounds::testing {

// What every node's backend shares: the keys, the watches of running rounds.
struct FakeWorld {
  std::mutex mu;
  std::condition_variable cv;
  MemoryKeys<> kv;
  bool down = false;  // every request fails, as with a backend gone
  struct Watch {
    int round, group_rank;
    std::weak_ptr<LivenessEvents> events;
  };
  std::vector<Watch> watches;
  int cleared = 0;  // clear_run calls
  std::map<std::string, int> looks;  // add(key, 0) calls by key: a node reading a counter (a test waits for it)
  // Called after each add(key, 0), outside the lock: a test's node arriving right after a read.
  // Set before the nodes run, cleared before what it refers to goes.
  std::function<void(const std::string& key)> looked;

  void check_up() {
    if (down) throw NetworkError("fake backend: gone");
  }
  // Group rank g of `round` stopped answering: the other members' watches say so.
  void lose(int round, int g) {
    std::vector<std::shared_ptr<LivenessEvents>> tell;
    {
      std::lock_guard<std::mutex> lk(mu);
      for (auto& w : watches) {
        if (w.round != round || w.group_rank == g) continue;
        if (auto e = w.events.lock()) tell.push_back(e);
      }
    }
    for (auto& e : tell) e->peer_lost(round, g, 1.5);
  }
  void set(const std::string& key, const std::string& value) {
    {
      std::lock_guard<std::mutex> lk(mu);
      kv.put(key, {value});
    }
    cv.notify_all();
  }
  std::optional<std::string> value(const std::string& key) {
    std::lock_guard<std::mutex> lk(mu);
    return kv.get(key);
  }
};

class FakeConnection : public Connection {
 public:
  explicit FakeConnection(std::shared_ptr<FakeWorld> w) : w_(std::move(w)) {}
  std::optional<std::string> get(const Key& k) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    w_->check_up();
    return w_->kv.get(k.text());
  }
  void put(const Key& k, const std::string& v, Lifetime) override {
    {
      std::lock_guard<std::mutex> lk(w_->mu);
      w_->check_up();
      w_->kv.put(k.text(), {v});
    }
    w_->cv.notify_all();
  }
  std::string create(const Key& k, const std::string& v, Lifetime) override {
    std::string stands;
    {
      std::lock_guard<std::mutex> lk(w_->mu);
      w_->check_up();
      stands = w_->kv.create(k.text(), {v}).first.value;
    }
    w_->cv.notify_all();
    return stands;
  }
  std::int64_t add(const Key& k, std::int64_t d) override {
    std::int64_t n;
    {
      std::lock_guard<std::mutex> lk(w_->mu);
      w_->check_up();
      n = w_->kv.add(k.text(), d);
      if (d == 0) ++w_->looks[k.text()];
    }
    w_->cv.notify_all();
    if (d == 0 && w_->looked) w_->looked(k.text());
    return n;
  }
  bool wait(const std::vector<Key>& keys, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lk(w_->mu);
    return w_->cv.wait_until(lk, deadline, [&] {
      if (w_->down) return true;
      for (const auto& k : keys) {
        if (!w_->kv.has(k.text())) return false;
      }
      return true;
    }) && (w_->check_up(), true);
  }
  void clear_run() override {
    std::lock_guard<std::mutex> lk(w_->mu);
    w_->check_up();
    w_->kv.clear_run();
    ++w_->cleared;
  }
  std::string name(const Key& k) const override { return "fake/" + k.text(); }

 private:
  std::shared_ptr<FakeWorld> w_;
};

class FakeLiveness : public Liveness {};

class FakeBackend : public Backend {
 public:
  FakeBackend(std::shared_ptr<FakeWorld> w, std::weak_ptr<Renewals> r, bool holds = false,
              std::chrono::milliseconds ttl = std::chrono::seconds(1))
      : w_(std::move(w)), renewals_(std::move(r)), holds_(holds), ttl_(ttl) {}
  std::string where() const override { return "the fake backend"; }
  std::unique_ptr<Connection> connect(std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    w_->check_up();
    return std::make_unique<FakeConnection>(w_);
  }
  std::string reach() const override { return "127.0.0.1"; }
  bool holds_records() const override { return holds_; }
  std::chrono::milliseconds liveness_ttl() const override { return ttl_; }
  std::unique_ptr<Liveness> watch(const Members& m, std::weak_ptr<LivenessEvents> events) override {
    {
      std::lock_guard<std::mutex> lk(w_->mu);
      w_->watches.push_back({m.round, m.group_rank, std::move(events)});
    }
    if (auto r = renewals_.lock()) r->renewed(Clock::now());
    return std::make_unique<FakeLiveness>();
  }

 private:
  std::shared_ptr<FakeWorld> w_;
  std::weak_ptr<Renewals> renewals_;
  bool holds_;
  std::chrono::milliseconds ttl_;
};

}  // namespace ddprun::rounds::testing
