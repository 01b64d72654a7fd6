#include "control/saving_exchange.hpp"

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {

SavingExchange::SavingExchange(boost::asio::io_context& io) : io_(io), thread_([this] { run(); }) {}

SavingExchange::~SavingExchange() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // at most the request in flight: 2 s
}

void SavingExchange::use(const std::string& host, std::uint16_t port, int round) {
  if (host == host_ && port == port_ && round == round_) return;
  host_ = host, port_ = port, round_ = round;
  answer_.reset();
}

void SavingExchange::saving(bool on) {
  if (host_.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ops_.push_back({host_, port_, round_, on ? 1 : -1});
  }
  cv_.notify_all();
}

std::optional<bool> SavingExchange::others() {
  if (host_.empty()) return false;
  if (answer_ && std::chrono::steady_clock::now() - answered_at_ < std::chrono::seconds(1)) return answer_;
  if (!reading_) {
    reading_ = true;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ops_.push_back({host_, port_, round_, 0});
    }
    cv_.notify_all();
  }
  return std::nullopt;
}

void SavingExchange::run() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !ops_.empty(); });
      if (stop_) return;
      op = ops_.front();
      ops_.pop_front();
    }
    std::int64_t count = 0;
    try {
      rendezvous::TcpStoreOptions o;
      o.host = op.host;
      o.port = op.port;
      o.timeout = std::chrono::seconds(2);
      rendezvous::TcpStore store(o);
      count = store.add("ddprun/saving/" + std::to_string(op.round), op.delta);
    } catch (const std::exception& e) {
      spdlog::debug("ddprun: the saves' counter in the workers' store: {}", e.what());
      count = 0;  // unknown: nobody is taken to be saving, so that a hang is still found
    }
    if (op.delta != 0) continue;
    boost::asio::post(io_, [this, round = op.round, count] {
      reading_ = false;
      if (round != round_) return;
      answer_ = count > 0;
      answered_at_ = std::chrono::steady_clock::now();
    });
  }
}

}  // namespace ddprun::agent
