#include "control/saving_exchange.hpp"

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {
namespace {

constexpr auto kBeat = std::chrono::seconds(2);
constexpr auto kReadApart = std::chrono::milliseconds(2500);
constexpr auto kMoved = std::chrono::seconds(5);

}  // namespace

SavingExchange::SavingExchange(boost::asio::io_context& io) : io_(io), thread_([this] { run(); }) {}

SavingExchange::~SavingExchange() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // at most the request in flight
}

void SavingExchange::use(const std::string& host, std::uint16_t port, int round) {
  if (host == host_ && port == port_ && round == round_) return;
  host_ = host, port_ = port, round_ = round;
  count_.reset();
  failed_ = false;
}

void SavingExchange::queue(int delta) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ops_.push_back({host_, port_, round_, delta});
  }
  cv_.notify_all();
}

void SavingExchange::saving() {
  const auto now = Clock::now();
  if (host_.empty() || now - beat_at_ < kBeat) return;
  beat_at_ = now;
  queue(1);
}

std::optional<bool> SavingExchange::others() {
  if (host_.empty()) return false;
  const auto now = Clock::now();
  if (!reading_ && (!count_ || now - read_at_ >= kReadApart)) {
    reading_ = true;
    queue(0);
  }
  if (failed_) return false;
  if (!count_ || moved_at_ == Clock::time_point{}) return std::nullopt;  // read once: not known yet
  return now - moved_at_ < kMoved;
}

void SavingExchange::run() {
  std::unique_ptr<rendezvous::TcpStore> store;
  std::string at;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !ops_.empty(); });
      if (stop_) return;
      op = ops_.front();
      ops_.pop_front();
    }
    std::optional<std::int64_t> count;
    try {
      const std::string where = op.host + ":" + std::to_string(op.port);
      if (!store || at != where) {
        store.reset();
        rendezvous::TcpStoreOptions o;
        o.host = op.host;
        o.port = op.port;
        o.timeout = std::chrono::seconds(2);
        store = std::make_unique<rendezvous::TcpStore>(o);
        at = where;
      }
      count = store->add("ddprun/saving/" + std::to_string(op.round), op.delta);
    } catch (const std::exception& e) {
      spdlog::debug("ddprun: the saves' count in the workers' store: {}", e.what());
      store.reset();  // a new connection next time
    }
    if (op.delta != 0) continue;
    boost::asio::post(io_, [this, round = op.round, count] {
      reading_ = false;
      if (round != round_) return;
      const auto now = Clock::now();
      failed_ = !count;
      if (count) {
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
    });
  }
}

}  // namespace ddprun::agent
