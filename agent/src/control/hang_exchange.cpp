#include "control/hang_exchange.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {
namespace {

constexpr std::size_t kFrames = 6;  // innermost frames each side: a summary, not a dump

nlohmann::json frames_json(const std::vector<StackFrame>& frames) {
  auto out = nlohmann::json::array();
  for (std::size_t i = 0; i < frames.size() && i < kFrames; ++i) {
    out.push_back({frames[i].function, frames[i].file, frames[i].line});
  }
  return out;
}

std::vector<StackFrame> frames_from(const nlohmann::json& j) {
  std::vector<StackFrame> out;
  for (const auto& f : j) out.push_back({f.at(0).get<std::string>(), f.at(1).get<std::string>(), f.at(2).get<int>()});
  return out;
}

std::string key(const HangExchangeSetup& s, const std::string& rest) {
  return "ddprun/hang/" + std::to_string(s.attempt) + "/" + std::to_string(s.report) + "/" + rest;
}

}  // namespace

std::string hang_summary_json(const std::vector<RankView>& ranks) {
  auto out = nlohmann::json::array();
  for (const auto& r : ranks) {
    out.push_back({{"rank", r.rank}, {"local_rank", r.local_rank}, {"host", r.host}, {"pid", r.pid}, {"state", std::string(1, r.state)},
                   {"cpu", r.cpu}, {"silent", r.silent}, {"python", frames_json(r.python)},
                   {"native", frames_json(r.native)}, {"note", r.python_note}});
  }
  return out.dump();
}

std::vector<RankView> hang_summary_from_json(const std::string& text) {
  std::vector<RankView> out;
  for (const auto& j : nlohmann::json::parse(text)) {
    RankView r;
    r.rank = j.at("rank").get<int>();
    r.local_rank = j.value("local_rank", -1);
    r.host = j.at("host").get<std::string>();
    r.pid = j.at("pid").get<pid_t>();
    auto state = j.at("state").get<std::string>();
    r.state = state.empty() ? '?' : state[0];
    r.cpu = j.at("cpu").get<double>();
    r.silent = j.at("silent").get<bool>();
    r.python = frames_from(j.at("python"));
    r.native = frames_from(j.at("native"));
    r.python_note = j.at("note").get<std::string>();
    out.push_back(std::move(r));
  }
  return out;
}

HangExchange::~HangExchange() {
  threads_.join_all();  // each bounded by its store time-out
}

void HangExchange::start(HangExchangeSetup s, std::vector<RankView> mine, Done done) {
  std::random_device seed;
  const std::string nonce = std::to_string(seed()) + "-" + std::to_string(seed());
  threads_.run("the hang exchange", [this, s, nonce, mine = std::move(mine), done = std::move(done)] {
    std::optional<JobHangVerdict> result;
    std::string error;
    try {
      rendezvous::TcpStoreOptions o;
      o.host = s.store_host;
      o.port = s.store_port;
      o.timeout = s.wait + std::chrono::seconds(5);
      rendezvous::TcpStore store(o);
      nlohmann::json summary = {{"nonce", nonce}, {"ranks", nlohmann::json::parse(hang_summary_json(mine))}};
      store.set(key(s, "node/" + std::to_string(s.node)), summary.dump());
      JobHangVerdict v;
      if (store.add(key(s, "gather"), 1) == 1) {
        v.gathered_here = true;
        std::vector<std::string> nonces;
        std::vector<std::string> keys;
        for (int n = 0; n < s.nodes; ++n) keys.push_back(key(s, "node/" + std::to_string(n)));
        try {
          store.wait(keys, s.wait);
        } catch (const std::exception&) {  // some never came: decide over those that did
        }
        for (int n = 0; n < s.nodes; ++n) {
          if (!store.check({keys[static_cast<std::size_t>(n)]})) {
            v.missing_nodes.push_back(n);
            continue;
          }
          auto j = nlohmann::json::parse(store.get(keys[static_cast<std::size_t>(n)]));
          nonces.push_back(j.at("nonce").get<std::string>());
          for (auto& r : hang_summary_from_json(j.at("ranks").dump())) v.ranks.push_back(std::move(r));
        }
        v.verdict = decide_hang(v.ranks);
        nlohmann::json j = {{"kind", to_string(v.verdict.kind)}, {"blamed", v.verdict.blamed},
                            {"text", v.verdict.text}, {"missing", v.missing_nodes}, {"nonces", nonces},
                            {"ranks", nlohmann::json::parse(hang_summary_json(v.ranks))}};
        store.set(key(s, "verdict"), j.dump());
      } else {
        store.wait({key(s, "verdict")}, s.wait + std::chrono::seconds(3));
        auto j = nlohmann::json::parse(store.get(key(s, "verdict")));
        const auto nonces = j.at("nonces").get<std::vector<std::string>>();
        if (std::find(nonces.begin(), nonces.end(), nonce) == nonces.end()) {
          throw std::runtime_error("the job's verdict was decided without this node's summary (report " +
                                   std::to_string(s.report) + " of this attempt here is another one there)");
        }
        v.verdict.text = j.at("text").get<std::string>();
        v.verdict.blamed = j.at("blamed").get<std::vector<int>>();
        const auto kind = j.at("kind").get<std::string>();
        for (auto k : {HangKind::stopped, HangKind::uninterruptible, HangKind::stuck, HangKind::spinning,
                       HangKind::mismatch, HangKind::undecided}) {
          if (kind == to_string(k)) v.verdict.kind = k;
        }
        v.missing_nodes = j.at("missing").get<std::vector<int>>();
        v.ranks = hang_summary_from_json(j.at("ranks").dump());
      }
      result = std::move(v);
    } catch (const std::exception& e) {
      error = e.what();
    }
    boost::asio::post(io_, [done, result = std::move(result), error = std::move(error)]() mutable {
      done(std::move(result), std::move(error));
    });
  });
}

}  // namespace ddprun::agent
