#include "control/pace_exchange.hpp"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <vector>

#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {
namespace {

std::string key(int round, int node) {
  return "ddprun/pace/" + std::to_string(round) + "/node/" + std::to_string(node);
}

}  // namespace

PaceExchange::~PaceExchange() {
  threads_.join_all();  // each bounded by its store time-out
}

void PaceExchange::window(const PaceSetup& s, const std::map<int, double>& busy, Done done) {
  if (running_.exchange(true)) return;
  nlohmann::json shares = nlohmann::json::object();
  for (const auto& [rank, share] : busy) shares[std::to_string(rank)] = share;
  const std::string mine = nlohmann::json{{"seq", ++seq_}, {"host", s.host}, {"busy", shares}}.dump();
  auto work = [this, s, mine, done = std::move(done)] {
    JobPace job;
    try {
      rendezvous::TcpStoreOptions o;
      o.host = s.store_host;
      o.port = s.store_port;
      o.timeout = std::chrono::seconds(2);  // bounds the agent's exit, which joins this thread
      rendezvous::TcpStore store(o);
      store.set(key(s.round, s.node), mine);
      if (s.node == 0) {
        std::vector<std::string> keys;
        for (int n = 0; n < s.nodes; ++n) keys.push_back(key(s.round, n));
        if (store.check(keys)) {  // every node has written once (a MULTI_GET waits for missing keys)
          const auto values = store.multi_get(keys);
          for (int n = 0; n < s.nodes; ++n) {
            auto j = nlohmann::json::parse(values.at(static_cast<std::size_t>(n)));
            const auto seq = j.at("seq").get<std::int64_t>();
            auto& last = read_seq_[n];
            if (seq == last) continue;  // not written since: its ranks sit this window out
            last = seq;
            const auto host = j.at("host").get<std::string>();
            for (const auto& [rank, share] : j.at("busy").items()) job[std::stoi(rank)] = {host, share.get<double>()};
          }
        }
      }
    } catch (const std::exception& e) {
      spdlog::debug("ddprun: the pace exchange: {}", e.what());
      job.clear();
    }
    running_ = false;
    if (s.node == 0) boost::asio::post(io_, [done, job = std::move(job)]() mutable { done(std::move(job)); });
  };
  try {
    threads_.run("the pace exchange", std::move(work));
  } catch (const std::exception& e) {  // no thread to be had: this window is skipped, nothing more
    running_ = false;
    spdlog::debug("ddprun: the pace exchange: {}", e.what());
  }
}

}  // namespace ddprun::agent
