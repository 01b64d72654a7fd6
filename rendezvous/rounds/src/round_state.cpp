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

std::string assignment_json(const Assignment& a) {
  if (a.stopped) return text(json{{"stopped", true}});
  if (!a.refused.empty()) return text(json{{"refused", a.refused}});
  json j{{"group_rank", a.group_rank}, {"offset", a.offset}, {"world", a.world}, {"next", a.next},
         {"next_host", a.next_host},   {"rc", a.rc},         {"streak", json::parse(a.streak)}};
  if (!a.next_link.empty()) j["next_link"] = a.next_link;
  if (a.holders > 0) j["holders"] = a.holders;
  return text(j);
}

Assignment parse_assignment(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  Assignment a;
  a.stopped = field<bool>(j, key, "stopped", false);
  if (a.stopped) return a;
  a.refused = field<std::string>(j, key, "refused", "");
  if (!a.refused.empty()) return a;
  a.group_rank = field<int>(j, key, "group_rank", -1);
  a.offset = field<int>(j, key, "offset", -1);
  a.world = field<int>(j, key, "world", 0);
  a.next = field<int>(j, key, "next", -1);
  a.next_host = field<std::string>(j, key, "next_host", "");
  a.rc = field<std::string>(j, key, "rc", "");
  a.next_link = field<std::string>(j, key, "next_link", "");
  a.holders = field<int>(j, key, "holders", 0);
  if (a.group_rank < 0 || a.offset < 0 || a.world < 1 || a.offset >= a.world || a.next < 0 || a.rc.empty() ||
      a.holders < 0) {
    malformed(key, "group_rank, offset, world, next, holders or rc missing or out of range");
  }
  auto s = j.find("streak");
  if (s == j.end() || !s->is_object()) malformed(key, "field 'streak' is missing or not an object");
  a.streak = text(*s);
  return a;
}

std::string lineup_json(const Lineup& l) { return text(json{{"hosts", l.hosts}, {"arrivals", l.arrivals}}); }

Lineup parse_lineup(const std::string& key, const std::string& value, int members) {
  auto j = object(key, value);
  Lineup l;
  auto h = j.find("hosts"), a = j.find("arrivals");
  if (h == j.end() || a == j.end() || !h->is_array() || !a->is_array() || static_cast<int>(h->size()) != members ||
      static_cast<int>(a->size()) != members) {
    malformed(key, "fields 'hosts' and 'arrivals' must be lists of " + std::to_string(members));
  }
  for (const auto& x : *h) {
    if (!x.is_string()) malformed(key, "a host that is not a string");
    l.hosts.push_back(x.get<std::string>());
  }
  for (const auto& x : *a) {
    if (!x.is_number_integer() || x.get<long long>() < 0 || x.get<long long>() >= members) {
      malformed(key, "an arrival index out of range");
    }
    l.arrivals.push_back(x.get<int>());
  }
  return l;
}

std::string RunConfig::describe() const {
  return std::string(to_string(backend)) + ", " + std::to_string(min_nodes) +
         (min_nodes == max_nodes ? "" : " to " + std::to_string(max_nodes)) + " node" + (max_nodes == 1 ? "" : "s");
}

std::string RunConfig::differences(const RunConfig& mine) const {
  std::string out;
  auto add = [&](const std::string& theirs, const std::string& ours) {
    out += (out.empty() ? "" : "; and ") + theirs + "; this node: " + ours;
  };
  if (!(*this == mine)) add(describe(), mine.describe());
  if (keep_alive_ms >= 0 && mine.keep_alive_ms >= 0 &&
      (keep_alive_ms != mine.keep_alive_ms || keep_alive_attempts != mine.keep_alive_attempts)) {
    auto ka = [](const RunConfig& c) {
      return "keep_alive_interval=" + duration_text(std::chrono::milliseconds(c.keep_alive_ms)) +
             ", keep_alive_max_attempt=" + std::to_string(c.keep_alive_attempts);
    };
    add(ka(*this), ka(mine));
  }
  if (restart_policy && mine.restart_policy &&
      (max_restarts != mine.max_restarts || max_same_failures != mine.max_same_failures)) {
    auto policy = [](const RunConfig& c) {
      return "--max_restarts=" + std::to_string(c.max_restarts) + ", --max_same_failures=" + std::to_string(c.max_same_failures);
    };
    add(policy(*this), policy(mine));
  }
  return out;
}

std::string config_json(const RunConfig& c) {
  json j{{"backend", to_string(c.backend)}, {"min_nodes", c.min_nodes}, {"max_nodes", c.max_nodes}, {"protocol", c.protocol}};
  if (c.keep_alive_ms >= 0) {
    j["keep_alive_ms"] = c.keep_alive_ms;
    j["keep_alive_attempts"] = c.keep_alive_attempts;
  }
  if (c.restart_policy) {
    j["max_restarts"] = c.max_restarts;
    j["max_same_failures"] = c.max_same_failures;
  }
  return text(j);
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
  c.keep_alive_ms = field<long long>(j, key, "keep_alive_ms", -1);
  c.keep_alive_attempts = field<int>(j, key, "keep_alive_attempts", -1);
  c.restart_policy = j.contains("max_restarts");
  c.max_restarts = field<int>(j, key, "max_restarts", -1);
  c.max_same_failures = field<int>(j, key, "max_same_failures", -1);
  return c;
}

std::string claim_json(const RankClaim& c) { return text(json{{"node_id", c.node_id}, {"host", c.host}}); }

RankClaim parse_claim(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  return RankClaim{field<std::string>(j, key, "node_id", ""), field<std::string>(j, key, "host", "?")};
}

std::string finished_json(const FinishedMark& f) {
  json j{{"round", f.round}, {"at_ms", f.at_ms}};
  if (f.succeeded) j["succeeded"] = true;
  if (f.signal > 0) j["signal"] = f.signal, j["host"] = f.host;
  return text(j);
}

FinishedMark parse_finished(const std::string& key, const std::string& value, long long now_ms) {
  if (value == "1") return FinishedMark{-1, now_ms};
  auto j = object(key, value);
  FinishedMark f{field<int>(j, key, "round", -1), field<long long>(j, key, "at_ms", now_ms),
                 field<bool>(j, key, "succeeded", false), field<int>(j, key, "signal", 0),
                 field<std::string>(j, key, "host", "?")};
  if (f.signal < 0 || f.signal > 64) malformed(key, "field 'signal' is not a signal number");
  return f;
}

long long parse_number(const std::string& key, const std::string& value, long long lo, long long hi) {
  auto n = parse_int(value, lo, hi);
  if (!n) {
    malformed(key, "'" + value.substr(0, 40) + "' is not a number in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return *n;
}

}  // namespace ddprun::rounds
