#pragma once
// Requests to the workers' store off the agent's loop, for the exchanges across nodes that ask
// a little and often (a node's pace each window, the saves' count): one thread, one connection
// kept between requests (made again after a failure, or to another store), each request bounded
// at 2 s, in the order they were posted. A request posts its own answer to the loop.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ddprun::rendezvous {
class TcpStore;
}

namespace ddprun::agent {

class StoreQueue {
 public:
  // Runs on the queue's thread; throws where it fails.
  using Request = std::function<void(rendezvous::TcpStore&)>;
  // Runs on the queue's thread, with why, where the request threw or the store was not reached.
  using Failed = std::function<void(const std::string& why)>;

  StoreQueue();
  // Ends after the request in flight (bounded at 2 s); those not yet run are dropped.
  ~StoreQueue();
  StoreQueue(const StoreQueue&) = delete;
  StoreQueue& operator=(const StoreQueue&) = delete;

  void post(std::string host, std::uint16_t port, Request request, Failed failed = {});

 private:
  struct Item {
    std::string host;
    std::uint16_t port = 0;
    Request request;
    Failed failed;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddprun::agent
