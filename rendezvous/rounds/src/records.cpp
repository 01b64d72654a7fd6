#include "ddprun/rounds/records.hpp"

#include "ddprun/common/text.hpp"
#include "json_fields.hpp"

namespace ddprun::rounds {
namespace {

using namespace json_fields;

FailureRecord failure_from(const json& j, const std::string& key) {
  FailureRecord f;
  f.rank = field<int>(j, key, "rank", -1);
  f.local_rank = field<int>(j, key, "local_rank", -1);
  f.pid = field<pid_t>(j, key, "pid", 0);
  f.host = field<std::string>(j, key, "host", "?");
  f.reason = field<std::string>(j, key, "reason", "?");
  f.exit_code = field<int>(j, key, "exit_code", 1);
  f.status.signal = field<int>(j, key, "signal", 0);
  f.status.code = field<int>(j, key, "code", 0);
  f.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(field<long long>(j, key, "time_ms", 0)));
  f.error_file = field<std::string>(j, key, "error_file", "");
  f.message = field<std::string>(j, key, "message", "");
  f.traceback = field<std::string>(j, key, "traceback", "");
  f.hang = field<bool>(j, key, "hang", false);
  f.silent_s = field<double>(j, key, "silent_s", 0.0);
  auto tail = j.find("stderr_tail");
  if (tail != j.end() && !tail->is_null()) {
    if (!tail->is_array()) malformed(key, "field 'stderr_tail' is not an array");
    for (const auto& l : *tail) {
      if (!l.is_string()) malformed(key, "field 'stderr_tail' holds a non-string");
      f.stderr_tail.push_back(l.get<std::string>());
    }
  }
  if (f.exit_code < 0 || f.exit_code > 255) malformed(key, "field 'exit_code' is not 0-255");
  return f;
}

}  // namespace

std::string node_json(const NodeInfo& n) {
  json j{{"host", n.host},   {"addr", n.addr},           {"reach", n.reach},         {"nproc", n.nproc},
         {"node_rank", n.node_rank}, {"addrs", n.addrs}, {"last_round", n.last_round}, {"last_rank", n.last_rank}};
  // (Absent where there is no state: a job without it writes the records it did before.)
  if (!n.state.link.empty()) j["state_link"] = n.state.link;
  if (n.state.holds) j["holds_state"] = true;
  return text(j);
}

NodeInfo parse_node(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  NodeInfo n;
  n.host = field<std::string>(j, key, "host", "");
  n.addr = field<std::string>(j, key, "addr", "");
  n.reach = field<std::string>(j, key, "reach", "");
  n.nproc = field<int>(j, key, "nproc", 1);
  n.node_rank = field<int>(j, key, "node_rank", -1);
  n.last_round = field<int>(j, key, "last_round", -1);
  n.last_rank = field<int>(j, key, "last_rank", -1);
  n.state.link = field<std::string>(j, key, "state_link", "");
  n.state.holds = field<bool>(j, key, "holds_state", false);
  if (n.nproc < 1 || n.nproc > 1 << 20) malformed(key, "field 'nproc' is out of range");
  if (n.last_round < -1 || n.last_rank < -1) malformed(key, "field 'last_round' or 'last_rank' is below -1");
  // Addresses are advisory (the workers' store allows them): entries that are not strings are skipped.
  auto addrs = j.find("addrs");
  if (addrs != j.end() && addrs->is_array()) {
    for (const auto& a : *addrs) {
      if (a.is_string()) n.addrs.push_back(a.get<std::string>());
    }
  }
  return n;
}

const char* to_string(RoundEnd::Kind k) {
  switch (k) {
    case RoundEnd::Kind::failure: return "failure";
    case RoundEnd::Kind::node_lost: return "node_lost";
    case RoundEnd::Kind::membership: return "membership";
    case RoundEnd::Kind::stopped: return "stopped";
    case RoundEnd::Kind::success: return "success";
  }
  return "?";
}

RoundEnd RoundEnd::of_failure(FailureRecord f) {
  RoundEnd e;
  e.kind = Kind::failure;
  e.host = f.host;
  e.failure = std::move(f);
  return e;
}

RoundEnd RoundEnd::of_stop(int signal, std::string host, std::string by) {
  RoundEnd e;
  e.kind = Kind::stopped;
  e.signal = signal;
  e.host = std::move(host);
  e.by = std::move(by);
  return e;
}

RoundEnd RoundEnd::of_node_lost(int group_rank, std::string host, double idle_s,
                                std::chrono::system_clock::time_point since) {
  RoundEnd e;
  e.kind = Kind::node_lost;
  e.group_rank = group_rank;
  e.host = std::move(host);
  e.idle_s = idle_s;
  e.since = since;
  return e;
}

RoundEnd RoundEnd::of_membership(std::string host, std::chrono::system_clock::time_point since) {
  RoundEnd e;
  e.kind = Kind::membership;
  e.host = std::move(host);
  e.since = since;
  return e;
}

RoundEnd RoundEnd::of_success() { return RoundEnd{}; }

std::string round_end_json(const RoundEnd& e) {
  json j = {{"kind", to_string(e.kind)}};
  switch (e.kind) {
    case RoundEnd::Kind::failure: {
      const FailureRecord& f = *e.failure;
      j.update(json{{"rank", f.rank}, {"local_rank", f.local_rank}, {"pid", f.pid}, {"host", f.host},
                    {"reason", f.reason}, {"exit_code", f.exit_code}, {"hang", f.hang}, {"silent_s", f.silent_s},
                    {"signal", f.status.signal}, {"code", f.status.code},
                    {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(f.time.time_since_epoch()).count()},
                    {"error_file", f.error_file}, {"message", f.message}, {"traceback", f.traceback},
                    {"stderr_tail", std::vector<std::string>(f.stderr_tail.begin(), f.stderr_tail.end())}});
      break;
    }
    case RoundEnd::Kind::node_lost:
      j.update(json{{"group_rank", e.group_rank}, {"host", e.host}, {"idle_s", e.idle_s}});
      break;
    case RoundEnd::Kind::stopped:
      j.update(json{{"signal", e.signal}, {"host", e.host}, {"by", e.by}});
      break;
    case RoundEnd::Kind::membership:
      j["host"] = e.host;
      break;
    case RoundEnd::Kind::success:
      break;
  }
  if (e.since.time_since_epoch().count() != 0) {
    j["since_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(e.since.time_since_epoch()).count();
  }
  return text(j);
}

RoundEnd parse_round_end(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  RoundEnd r;
  const std::string kind = field<std::string>(j, key, "kind", "");
  bool known = false;
  for (auto k : {RoundEnd::Kind::failure, RoundEnd::Kind::node_lost, RoundEnd::Kind::membership,
                 RoundEnd::Kind::stopped, RoundEnd::Kind::success}) {
    if (kind == to_string(k)) {
      r.kind = k;
      known = true;
    }
  }
  if (!known) {
    malformed(key, "field 'kind' is '" + escape_for_log(kind, 40) +
                       "', not one of failure, node_lost, membership, stopped, success");
  }
  r.host = field<std::string>(j, key, "host", "?");
  r.group_rank = field<int>(j, key, "group_rank", -1);
  r.signal = field<int>(j, key, "signal", 0);
  r.by = field<std::string>(j, key, "by", "");
  r.idle_s = field<double>(j, key, "idle_s", 0.0);
  r.since = std::chrono::system_clock::time_point(std::chrono::milliseconds(field<long long>(j, key, "since_ms", 0)));
  if (r.signal < 0 || r.signal > 64) malformed(key, "field 'signal' is not a signal number");
  if (r.kind == RoundEnd::Kind::failure) r.failure = failure_from(j, key);
  return r;
}

Streak Streak::after(const FailureRecord& f) const {
  const std::string c = "rank " + std::to_string(f.rank) + (f.hang ? ", hang" : "") + ", signal " +
                        std::to_string(f.status.signal) + ", code " + std::to_string(f.status.code);
  Streak s;
  s.cause = c;
  s.same = c == cause ? same + 1 : 1;
  s.host = f.host;
  s.host_same = !host.empty() && f.host == host ? host_same + 1 : 1;
  return s;
}

AfterFailure after_failure(const Streak& round_streak, const FailureRecord& root_cause, int restart_count,
                           int max_restarts, int max_same_failures) {
  AfterFailure a;
  a.streak = round_streak.after(root_cause);
  if (max_same_failures > 0 && a.streak.same >= max_same_failures) {
    a.verdict = AfterFailure::Verdict::crash_loop;
  } else if (max_restarts >= 0 && restart_count + 1 > max_restarts) {
    a.verdict = AfterFailure::Verdict::no_restart_left;
  }
  return a;
}

std::string streak_json(const Streak& s) {
  return text(json{{"cause", s.cause}, {"same", s.same}, {"host", s.host}, {"host_same", s.host_same}});
}

Streak parse_streak(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  Streak s;
  s.cause = field<std::string>(j, key, "cause", "");
  s.same = field<int>(j, key, "same", 0);
  s.host = field<std::string>(j, key, "host", "");
  s.host_same = field<int>(j, key, "host_same", 0);
  if (s.same < 0 || s.host_same < 0) malformed(key, "field 'same' or 'host_same' is negative");
  return s;
}

}  // namespace ddprun::rounds
