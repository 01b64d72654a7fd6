#pragma once
// Saves across nodes (docs/usage.md: Hangs). While a rank is in torch.save, the ranks of the
// other nodes wait for it in a collective, silent, and each of their nodes would take that for a
// hang. So the saver's node adds 1 to ddprun/saving/ROUND in the workers' store as the save
// starts and takes it back as it ends, and a node that finds its ranks silent reads the counter
// before it reports them: one request a check, only while they are silent. The requests run on a
// thread of their own, in order (an end never overtakes its start), each bounded at 2 s; a read's
// answer is posted to the loop. A store that cannot be reached answers "nobody is saving", so that
// a hang is still found.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

class SavingExchange {
 public:
  explicit SavingExchange(boost::asio::io_context& io);
  ~SavingExchange();
  SavingExchange(const SavingExchange&) = delete;
  SavingExchange& operator=(const SavingExchange&) = delete;

  // The round's workers' store (a new round: a new counter). On the loop, as are the others.
  void use(const std::string& host, std::uint16_t port, int round);
  // A rank of this node started (true) or ended (false) a save.
  void saving(bool on);
  // Whether a rank of another node is saving, as read within the last second; nullopt while it
  // is being read.
  std::optional<bool> others();

 private:
  struct Op {
    std::string host;
    std::uint16_t port;
    int round;
    int delta;  // +1, -1, or 0: read
  };
  void run();

  boost::asio::io_context& io_;
  std::string host_;
  std::uint16_t port_ = 0;
  int round_ = -1;
  std::optional<bool> answer_;
  std::chrono::steady_clock::time_point answered_at_{};
  bool reading_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> ops_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddprun::agent
