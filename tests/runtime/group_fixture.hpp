#pragma once
// N ranks as threads over one in-process store server, each with its own client connection.

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rank_checks.hpp"

#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "ddprun/runtime/process_group.hpp"

namespace ddprun::test {

// The message of what `f` throws; empty when it returns.
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class Ranks {
 public:
  Ranks() : server_(options()) { server_.start(); }

  std::shared_ptr<rendezvous::Store> store(const std::string& prefix) {
    rendezvous::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = server_.port();
    o.timeout = std::chrono::seconds(30);
    return std::make_shared<rendezvous::PrefixStore>(prefix, std::make_shared<rendezvous::TcpStore>(o));
  }

  // Runs fn(rank, group) on `size` threads with a fresh gloo group; rethrows the first failure.
  void run(int size, const std::function<void(int, runtime::ProcessGroup&)>& fn,
           runtime::ProcessGroupOptions opt = {}) {
    std::string prefix = "group" + std::to_string(next_++);
    std::vector<std::thread> threads;
    std::mutex mu;
    std::exception_ptr first;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto pg = runtime::create_process_group("gloo", store(prefix), r, size, opt);
          fn(r, *pg);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

  std::uint16_t port() const { return server_.port(); }

 private:
  static rendezvous::StoreServerOptions options() {
    rendezvous::StoreServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }
  rendezvous::StoreServer server_;
  int next_ = 0;
};

}  // namespace ddprun::test
