#include "round_state.hpp"

#include "ddprun/common/text.hpp"
#include "json_fields.hpp"

namespace ddprun::rounds {

using namespace json_fields;

std::string closed_json(const Closed& c) {
  switch (c.kind) {
    case Closed::Kind::nodes: return text(json{{"nodes", c.nodes}});
    case Closed::Kind::stopped: return text(json{{"stopped", true}});
    case Closed::Kind::abandoned: return text(json{{"abandoned", c.rank}});
  }
  return "{}";
}

Closed parse_closed(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  if (field<bool>(j, key, "stopped", false)) return Closed::stopped();
  if (const int rank = field<int>(j, key, "abandoned", -1); rank >= 0) return Closed::abandoned(rank);
  int n = field<int>(j, key, "nodes", 0);
  if (n < 1) malformed(key, "field 'nodes' is missing or below 1");
  return Closed::of_nodes(n);
}

std::string store_json(const StoreAddress& s) {
  if (s.stopped) return text(json{{"stopped", true}});
  if (s.gone >= 0) return text(json{{"gone", s.gone}});
  return text(json{{"host", s.host}, {"port", s.port}});
}

StoreAddress parse_store(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  StoreAddress s;
  s.stopped = field<bool>(j, key, "stopped", false);
  if (s.stopped) return s;
  s.gone = field<int>(j, key, "gone", -1);
  if (s.gone >= 0) return s;
  s.host = field<std::string>(j, key, "host", "");
  s.port = field<std::uint16_t>(j, key, "port", 0);
  if (s.host.empty() || s.port == 0) malformed(key, "no host or port");
  return s;
}

std::string RunConfig::describe() const {
  return std::string(to_string(backend)) + ", " + std::to_string(min_nodes) +
         (min_nodes == max_nodes ? "" : " to " + std::to_string(max_nodes)) + " node" + (max_nodes == 1 ? "" : "s");
}

std::string config_json(const RunConfig& c) {
  return text(json{{"backend", to_string(c.backend)},
                   {"min_nodes", c.min_nodes},
                   {"max_nodes", c.max_nodes},
                   {"protocol", c.protocol}});
}

RunConfig parse_config(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  RunConfig c;
  const std::string b = field<std::string>(j, key, "backend", "");
  bool known = false;
  for (auto k : {BackendKind::static_ranks, BackendKind::c10d, BackendKind::etcd}) {
    if (b == to_string(k)) {
      c.backend = k;
      known = true;
    }
  }
  if (!known) malformed(key, "field 'backend' is '" + b.substr(0, 40) + "'");
  c.min_nodes = field<int>(j, key, "min_nodes", 0);
  c.max_nodes = field<int>(j, key, "max_nodes", 0);
  if (c.min_nodes < 1 || c.max_nodes < c.min_nodes) malformed(key, "min_nodes/max_nodes out of range");
  c.protocol = field<int>(j, key, "protocol", 1);
  return c;
}

std::string claim_json(const RankClaim& c) { return text(json{{"node_id", c.node_id}, {"host", c.host}}); }

RankClaim parse_claim(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  return RankClaim{field<std::string>(j, key, "node_id", ""), field<std::string>(j, key, "host", "?")};
}

std::string finished_json(const FinishedMark& f) { return text(json{{"round", f.round}, {"at_ms", f.at_ms}}); }

FinishedMark parse_finished(const std::string& key, const std::string& value, long long now_ms) {
  if (value == "1") return FinishedMark{-1, now_ms};
  auto j = object(key, value);
  return FinishedMark{field<int>(j, key, "round", -1), field<long long>(j, key, "at_ms", now_ms)};
}

long long parse_number(const std::string& key, const std::string& value, long long lo, long long hi) {
  auto n = parse_int(value, lo, hi);
  if (!n) {
    malformed(key, "'" + value.substr(0, 40) + "' is not a number in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return *n;
}

}  // namespace ddprun::rounds
