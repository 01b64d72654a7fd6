#include "round_records.hpp"

#include <nlohmann/json.hpp>

#include "ddprun/rendezvous/error.hpp"

namespace ddprun::agent {
namespace {

using json = nlohmann::json;

[[noreturn]] void malformed(const std::string& key, const std::string& why) {
  throw ProtocolError("rendezvous: malformed value at key '" + key + "': " + why +
                      " (written by a different ddprun version, or by something other than ddprun?)");
}

json object(const std::string& key, const std::string& value) {
  auto j = json::parse(value, nullptr, false);
  if (j.is_discarded()) malformed(key, "not JSON (" + std::to_string(value.size()) + " bytes)");
  if (!j.is_object()) malformed(key, std::string("a JSON ") + j.type_name() + ", not an object");
  return j;
}

template <typename T>
T field(const json& j, const std::string& key, const char* name, T fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) malformed(key, std::string("field '") + name + "' is a " + it->type_name() + ", not a string");
    return it->template get<std::string>();
  } else {
    if (!it->is_number_integer()) {
      malformed(key, std::string("field '") + name + "' is a " + it->type_name() + ", not an integer");
    }
    auto v = it->template get<long long>();
    if (v < static_cast<long long>(std::numeric_limits<T>::min()) || v > static_cast<long long>(std::numeric_limits<T>::max())) {
      malformed(key, std::string("field '") + name + "' is out of range");
    }
    return static_cast<T>(v);
  }
}

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
  return json{{"host", n.host}, {"addr", n.addr}, {"nproc", n.nproc}, {"node_rank", n.node_rank}, {"addrs", n.addrs}}
      .dump();
}

NodeInfo parse_node(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  NodeInfo n;
  n.host = field<std::string>(j, key, "host", "");
  n.addr = field<std::string>(j, key, "addr", "");
  n.nproc = field<int>(j, key, "nproc", 1);
  n.node_rank = field<int>(j, key, "node_rank", -1);
  if (n.nproc < 1 || n.nproc > 1 << 20) malformed(key, "field 'nproc' is out of range");
  // Addresses are advisory (the workers' store allows them): entries that are not strings are skipped.
  auto addrs = j.find("addrs");
  if (addrs != j.end() && addrs->is_array()) {
    for (const auto& a : *addrs) {
      if (a.is_string()) n.addrs.push_back(a.get<std::string>());
    }
  }
  return n;
}

std::string failure_json(const FailureRecord& f) {
  return json{{"kind", "failure"},
              {"rank", f.rank},
              {"local_rank", f.local_rank},
              {"pid", f.pid},
              {"host", f.host},
              {"reason", f.reason},
              {"exit_code", f.exit_code},
              {"signal", f.status.signal},
              {"code", f.status.code},
              {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(f.time.time_since_epoch()).count()},
              {"error_file", f.error_file},
              {"message", f.message},
              {"traceback", f.traceback},
              {"stderr_tail", std::vector<std::string>(f.stderr_tail.begin(), f.stderr_tail.end())}}
      .dump();
}

std::string stopped_json(int signal, const std::string& host, const std::string& by) {
  return json{{"kind", "stopped"}, {"signal", signal}, {"host", host}, {"by", by}}.dump();
}

RoundEnd parse_round_end(const std::string& key, const std::string& value) {
  auto j = object(key, value);
  RoundEnd r;
  r.kind = field<std::string>(j, key, "kind", "");
  static const char* kKinds[] = {"failure", "node_lost", "membership", "stopped", "success"};
  bool known = false;
  for (const char* k : kKinds) known = known || r.kind == k;
  if (!known) malformed(key, "field 'kind' is '" + r.kind.substr(0, 40) + "', not one of failure, node_lost, membership, stopped, success");
  r.host = field<std::string>(j, key, "host", "?");
  r.group_rank = field<int>(j, key, "group_rank", -1);
  r.signal = field<int>(j, key, "signal", 0);
  r.by = field<std::string>(j, key, "by", "");
  if (r.signal < 0 || r.signal > 64) malformed(key, "field 'signal' is not a signal number");
  if (r.kind == "failure") r.failure = failure_from(j, key);
  return r;
}

FailureRecord parse_failure(const std::string& key, const std::string& value) { return failure_from(object(key, value), key); }

}  // namespace ddprun::agent
