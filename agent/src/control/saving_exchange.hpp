#pragma once
// Saves across nodes (docs/usage.md: Hangs). While a rank is in torch.save, the ranks of the
// other nodes wait for it in a collective, silent, and each of their nodes would take that for a
// hang. So while a rank of a node saves, its node adds 1 to ddprun/saving/ROUND in the workers'
// store every 2 s (a beat, not a flag: nothing is left set by a node that died mid-save or a
// request that failed), and a node that finds its ranks silent reads the count before it reports
// them: someone is saving while the count moved within the last 7 s. It reads twice, 3.5 s apart
// (a node's beats come at most 3 s apart, at its checks), before it knows, each silence afresh
// (asks more than 1.5 s apart: a new silence); a read that fails answers "nobody is saving", so
// that a hang is still found.
// The requests run on the store queue (control/store_queue.hpp), each bounded at 2 s; a read's
// answer is posted to the loop.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

class StoreQueue;

class SavingExchange {
 public:
  using Clock = std::chrono::steady_clock;
  // `queue` outlives neither this nor the loop's handlers it posts (its owner ends it first).
  SavingExchange(boost::asio::io_context& io, StoreQueue& queue) : io_(io), queue_(queue) {}
  SavingExchange(const SavingExchange&) = delete;
  SavingExchange& operator=(const SavingExchange&) = delete;

  // The round's workers' store (a new round: a new count). On the loop, as are the others.
  void use(const std::string& host, std::uint16_t port, int round);
  // A rank of this node is saving now (called at each check while it does): a beat every 2 s.
  void saving();
  // Whether a rank of another node is saving; nullopt until the count has been read twice.
  std::optional<bool> others();

 private:
  void queue(int delta);  // 1: a beat, 0: a read
  void on_read(int round, std::uint64_t silence, std::optional<std::int64_t> count);  // on the loop

  boost::asio::io_context& io_;
  StoreQueue& queue_;
  std::string host_;
  std::uint16_t port_ = 0;
  int round_ = -1;
  Clock::time_point beat_at_{};
  // Reads: the count last read, when it was read, when it was last seen to move.
  std::optional<std::int64_t> count_;
  Clock::time_point read_at_{}, moved_at_{};
  Clock::time_point asked_at_{};  // the last others(): the silence it belongs to
  std::uint64_t silence_ = 0;     // silences begun: a read of an earlier one is let go
  bool failed_ = false;  // the last read did not get through: nobody is taken to be saving
  bool reading_ = false;
  bool beating_ = false;  // a beat queued, not yet answered: the next waits (no backlog behind a slow store)
};

}  // namespace ddprun::agent
