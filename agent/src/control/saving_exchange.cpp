#include "control/saving_exchange.hpp"

#include <boost/asio.hpp>

#include "control/store_queue.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {
namespace {

// A node beats at its checks (at most 1 s apart: worker_group.cpp), so its beats come at most
// kBeat + 1 s apart; reads further apart than that see at least one between them.
constexpr auto kBeat = std::chrono::seconds(2);
constexpr auto kReadApart = std::chrono::milliseconds(3500);
constexpr auto kMoved = 2 * kReadApart;
// A silence asks at each check (at most 1 s apart): a longer pause between two asks ends it.
constexpr auto kSilenceGap = std::chrono::milliseconds(1500);

}  // namespace

void SavingExchange::use(const std::string& host, std::uint16_t port, int round) {
  if (host == host_ && port == port_ && round == round_) return;
  host_ = host, port_ = port, round_ = round;
  count_.reset();
  failed_ = false;
}

void SavingExchange::saving() {
  const auto now = Clock::now();
  if (host_.empty() || now - beat_at_ < kBeat || beating_) return;  // one beat in flight at most
  beat_at_ = now;
  beating_ = true;
  queue(1);
}

std::optional<bool> SavingExchange::others() {
  if (host_.empty()) return false;
  const auto now = Clock::now();
  if (now - asked_at_ > kSilenceGap) {
    // A new silence: what an earlier one read (a save that has ended) says nothing of it, and it
    // reads twice afresh. (Taken as they stood, a rank of another node that started working
    // alone since, its node beating for it, was answered "nobody" at once.) A read still under
    // way is of the earlier one: its answer is let go.
    count_.reset();
    failed_ = false;
    ++silence_;
  }
  asked_at_ = now;
  if (!reading_ && (!count_ || now - read_at_ >= kReadApart)) {
    reading_ = true;
    queue(0);
  }
  if (failed_) return false;
  if (!count_ || moved_at_ == Clock::time_point{}) return std::nullopt;  // read once: not known yet
  return now - moved_at_ < kMoved;
}

void SavingExchange::queue(int delta) {
  const int round = round_;
  const std::uint64_t silence = silence_;
  const std::string key = "ddprun/saving/" + std::to_string(round);
  auto answer = [this, delta, round, silence](std::optional<std::int64_t> count) {
    boost::asio::post(io_, [this, delta, round, silence, count] {
      if (delta == 0) {
        on_read(round, silence, count);
      } else {
        beating_ = false;
      }
    });
  };
  queue_.post(host_, port_, [key, delta, answer](rendezvous::TcpStore& store) { answer(store.add(key, delta)); },
              [answer](const std::string&) { answer(std::nullopt); });
}

void SavingExchange::on_read(int round, std::uint64_t silence, std::optional<std::int64_t> count) {
  reading_ = false;
  if (round != round_ || silence != silence_) return;
  const auto now = Clock::now();
  failed_ = !count;
  if (!count) return;
  if (!count_) {
    moved_at_ = {};  // the first read: whether it moves is seen at the next
  } else if (*count != *count_) {
    moved_at_ = now;
  } else if (moved_at_ == Clock::time_point{}) {
    moved_at_ = now - kMoved;  // read twice, unmoved: nobody is saving
  }
  count_ = count;
  read_at_ = now;
}

}  // namespace ddprun::agent
