#include "control/store_queue.hpp"

#include <memory>
#include <spdlog/spdlog.h>

#include "ddprun/common/thread.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {

StoreQueue::StoreQueue() : thread_(start_thread("the workers' store queue", [this] { run(); })) {}

StoreQueue::~StoreQueue() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StoreQueue::post(std::string host, std::uint16_t port, Request request, Failed failed) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    items_.push_back({std::move(host), port, std::move(request), std::move(failed)});
  }
  cv_.notify_all();
}

void StoreQueue::run() {
  std::unique_ptr<rendezvous::TcpStore> store;
  std::string at;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !items_.empty(); });
      if (stop_) return;
      item = std::move(items_.front());
      items_.pop_front();
    }
    try {
      const std::string where = item.host + ":" + std::to_string(item.port);
      if (!store || at != where) {
        store.reset();
        rendezvous::TcpStoreOptions o;
        o.host = item.host;
        o.port = item.port;
        o.timeout = std::chrono::seconds(2);  // bounds the agent's exit, which joins this thread
        store = std::make_unique<rendezvous::TcpStore>(o);
        at = where;
      }
      item.request(*store);
    } catch (const std::exception& e) {
      store.reset();  // a new connection next time
      spdlog::debug("ddprun: a request to the workers' store: {}", e.what());
      if (item.failed) item.failed(e.what());
    }
  }
}

}  // namespace ddprun::agent
