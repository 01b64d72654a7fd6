#include "control/pace_exchange.hpp"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <vector>

#include "control/store_queue.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {
namespace {

std::string key(int round, int node) {
  return "ddprun/pace/" + std::to_string(round) + "/node/" + std::to_string(node);
}

}  // namespace

void PaceExchange::window(const PaceSetup& s, const std::map<int, double>& busy, Done done) {
  if (running_) return;  // the last window's request still waits its turn
  running_ = true;
  nlohmann::json shares = nlohmann::json::object();
  for (const auto& [rank, share] : busy) shares[std::to_string(rank)] = share;
  const std::string mine = nlohmann::json{{"seq", ++seq_}, {"host", s.host}, {"busy", shares}}.dump();
  // Its answer, on the loop: group rank 0 hands on the job's pace (none where the store failed).
  auto answer = [this, node = s.node, done](JobPace job) {
    boost::asio::post(io_, [this, node, done, job = std::move(job)]() mutable {
      running_ = false;
      if (node == 0) done(std::move(job));
    });
  };
  queue_.post(
      s.store_host, s.store_port,
      [this, s, mine, answer](rendezvous::TcpStore& store) {
        JobPace job;
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
        answer(std::move(job));
      },
      [answer](const std::string&) { answer({}); });
}

}  // namespace ddprun::agent
