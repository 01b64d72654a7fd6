#include "etcd_client.hpp"

#include <openssl/evp.h>

#include <algorithm>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "etcd_client_impl.hpp"
#include "etcd_transport.hpp"

namespace ddprun::rounds {
namespace etcd_detail {

namespace http = boost::beast::http;

std::string b64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(s.data()),
                          static_cast<int>(s.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string unb64(const std::string& s) {
  if (s.empty()) return {};
  std::string out(3 * s.size() / 4, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(s.data()),
                          static_cast<int>(s.size()));
  if (n < 0) throw ProtocolError("etcd: a value that is not base64");
  std::size_t pad = (s.size() >= 1 && s.back() == '=') + (s.size() >= 2 && s[s.size() - 2] == '=');
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

std::string prefix_end(std::string p) {
  while (!p.empty() && static_cast<unsigned char>(p.back()) == 0xff) p.pop_back();
  if (p.empty()) return std::string(1, '\0');
  p.back() = static_cast<char>(static_cast<unsigned char>(p.back()) + 1);
  return p;
}

std::int64_t num(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_string()) return parse_int(it->get<std::string>()).value_or(0);
  return it->is_number_integer() ? it->get<std::int64_t>() : 0;
}

EtcdKv kv_of(const json& j) {
  EtcdKv kv;
  kv.key = unb64(j.value("key", ""));
  kv.value = unb64(j.value("value", ""));
  kv.create_revision = num(j, "create_revision");
  kv.mod_revision = num(j, "mod_revision");
  kv.lease = num(j, "lease");
  kv.version = num(j, "version");
  return kv;
}

// The gateway writes errors two ways: {"error": "...", "code": N, "message": "..."} and, for
// streams, {"error": {"grpc_code": N, "message": "..."}}. A member without a leader answers
// "no leader", "request timed out" (code 14) or, for a lease, "context deadline exceeded".
Refused refused_of(const json& j, int http_status) {
  const json& e = j.contains("error") && j["error"].is_object() ? j["error"] : j;
  std::string msg = e.value("message", e.contains("error") && e["error"].is_string() ? e["error"].get<std::string>()
                                                                                   : "HTTP " + std::to_string(http_status));
  int code = e.value("code", e.value("grpc_code", 0));
  bool auth = code == 16 || code == 7 || msg.find("authenticat") != std::string::npos ||
              msg.find("permission denied") != std::string::npos || msg.find("user name") != std::string::npos;
  bool transient = code == 14 || code == 4 || msg.find("leader") != std::string::npos ||
                   msg.find("unavailable") != std::string::npos || msg.find("timed out") != std::string::npos ||
                   msg.find("deadline exceeded") != std::string::npos;
  return {msg, transient, auth};
}

}  // namespace etcd_detail

using namespace etcd_detail;
namespace beast = boost::beast;
namespace http = beast::http;
using namespace std::chrono_literals;

EtcdClient::EtcdClient(EtcdOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.endpoints.empty()) throw UsageError("no etcd endpoint given");
  check_etcd_tls(options.endpoints, options.tls);
  if (options.tls.enabled()) impl_->tls = make_tls_context(options.tls);
  impl_->opt = std::move(options);
  impl_->kept.resize(impl_->opt.endpoints.size());
}
EtcdClient::~EtcdClient() = default;

std::optional<EtcdKv> EtcdClient::get(const std::string& key) {
  auto j = impl_->call("/v3/kv/range", {{"key", b64(key)}});
  revision_ = num(j["header"], "revision");
  if (!j.contains("kvs") || j["kvs"].empty()) return std::nullopt;
  return kv_of(j["kvs"][0]);
}

std::vector<EtcdKv> EtcdClient::get_prefix(const std::string& prefix) {
  auto j = impl_->call("/v3/kv/range", {{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))},
                                        {"sort_order", "ASCEND"}, {"sort_target", "CREATE"}});
  revision_ = num(j["header"], "revision");
  std::vector<EtcdKv> out;
  for (const auto& kv : j.value("kvs", json::array())) out.push_back(kv_of(kv));
  return out;
}

std::int64_t EtcdClient::put(const std::string& key, const std::string& value, std::int64_t lease) {
  json body = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  auto j = impl_->call("/v3/kv/put", body);
  return revision_ = num(j["header"], "revision");
}

void EtcdClient::put_all(const std::vector<std::string>& keys, const std::vector<std::string>& values, std::int64_t lease) {
  for (std::size_t from = 0; from < keys.size(); from += kTxnPuts) {
    json puts = json::array();
    for (std::size_t i = from; i < keys.size() && i < from + kTxnPuts; ++i) {
      json put = {{"key", b64(keys[i])}, {"value", b64(values.at(i))}};
      if (lease) put["lease"] = std::to_string(lease);
      puts.push_back({{"request_put", put}});
    }
    auto j = impl_->call("/v3/kv/txn", {{"success", puts}});
    revision_ = num(j["header"], "revision");
  }
}

bool EtcdClient::create(const std::string& key, const std::string& value, std::int64_t lease, EtcdKv* existing) {
  json put = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  json txn = {{"compare", json::array({{{"key", b64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
              {"success", json::array({{{"request_put", put}}})},
              {"failure", json::array({{{"request_range", {{"key", b64(key)}}}}})}};
  auto j = impl_->call("/v3/kv/txn", txn);
  revision_ = num(j["header"], "revision");
  bool created = j.value("succeeded", false);
  if (!created && existing) {
    for (const auto& r : j.value("responses", json::array())) {
      auto range = r.find("response_range");
      if (range != r.end() && range->contains("kvs") && !(*range)["kvs"].empty()) *existing = kv_of((*range)["kvs"][0]);
    }
  }
  return created;
}

bool EtcdClient::replace(const std::string& key, const std::string& value, std::int64_t mod_revision) {
  json txn = {{"compare", json::array({{{"key", b64(key)}, {"target", "MOD"}, {"result", "EQUAL"},
                                        {"mod_revision", std::to_string(mod_revision)}}})},
              {"success", json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(value)}}}}})}};
  auto j = impl_->call("/v3/kv/txn", txn);
  revision_ = num(j["header"], "revision");
  return j.value("succeeded", false);
}

std::int64_t EtcdClient::delete_prefix(const std::string& prefix) {
  auto j = impl_->call("/v3/kv/deleterange", {{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))}});
  revision_ = num(j["header"], "revision");
  return num(j, "deleted");
}

namespace {
// A counter_add() counter from the reads of its key and of its d/ marks (in a transaction's
// responses, or plain range responses).
std::int64_t counter_of(const json& key_range, const json& marks) {
  std::int64_t n = 0;
  for (const auto& kv : key_range.value("kvs", json::array())) n += num(kv, "version");
  for (const auto& kv : marks.value("kvs", json::array())) {
    auto d = parse_int(unb64(kv.value("value", "")));
    if (!d) throw ProtocolError("etcd: malformed counter mark at key '" + unb64(kv.value("key", "")) + "'");
    n += *d - 1;
  }
  return n;
}
json range_of(const std::string& key, bool prefix, std::int64_t revision = 0) {
  json r = {{"key", b64(key)}};
  if (prefix) r["range_end"] = b64(prefix_end(key));
  if (revision) r["revision"] = std::to_string(revision);
  return r;
}
json response_range(const json& txn, std::size_t i) {
  auto rs = txn.find("responses");
  if (rs == txn.end() || !rs->is_array() || i >= rs->size()) return json::object();
  auto r = (*rs)[i].find("response_range");
  return r == (*rs)[i].end() || !r->is_object() ? json::object() : *r;
}
}  // namespace

std::int64_t EtcdClient::counter_add(const std::string& key, std::int64_t delta, const std::string& token) {
  const std::string mark = key + (delta == 1 ? "/+1/" : "/d/") + token, marks = key + "/d/";
  const json txn = {
      {"compare", json::array({{{"key", b64(mark)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(std::to_string(delta))}}}},
                               {{"request_put", {{"key", b64(mark)}, {"value", b64(std::to_string(delta))}}}},
                               {{"request_range", range_of(key, false)}},
                               {{"request_range", range_of(marks, true)}}})},
      {"failure", json::array({{{"request_range", range_of(mark, false)}}})}};
  for (;;) {
    auto j = impl_->call("/v3/kv/txn", txn);
    revision_ = num(j["header"], "revision");
    if (j.value("succeeded", false)) return counter_of(response_range(j, 2), response_range(j, 3));
    // Applied before (a retry): the counter as of that transaction's revision.
    const json was = response_range(j, 0).value("kvs", json::array());
    if (was.empty()) continue;  // the run's keys were cleared in between: add anew
    const std::int64_t at = num(was[0], "mod_revision");
    auto k = impl_->call("/v3/kv/range", range_of(key, false, at));
    auto d = impl_->call("/v3/kv/range", range_of(marks, true, at));
    return counter_of(k, d);
  }
}

std::int64_t EtcdClient::counter(const std::string& key) {
  const json txn = {{"success", json::array({{{"request_range", range_of(key, false)}},
                                             {{"request_range", range_of(key + "/d/", true)}}})}};
  auto j = impl_->call("/v3/kv/txn", txn);
  revision_ = num(j["header"], "revision");
  return counter_of(response_range(j, 0), response_range(j, 1));
}

std::int64_t EtcdClient::grant_lease(std::chrono::seconds ttl) {
  auto j = impl_->call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}});
  if (j.contains("header")) lease_term_ = num(j["header"], "raft_term");
  return num(j, "ID");
}

bool EtcdClient::keep_alive(std::int64_t lease, std::chrono::milliseconds patient) {
  auto j = impl_->call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, patient);
  auto r = j.contains("result") ? j["result"] : j;
  if (r.contains("header")) lease_term_ = num(r["header"], "raft_term");
  return num(r, "TTL") > 0;
}

EtcdClient::Status EtcdClient::status() {
  auto j = impl_->call("/v3/maintenance/status", json::object());
  auto id = [&](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  return {id(j["header"].value("member_id", json(""))), id(j.value("leader", json("0"))), num(j, "raftTerm")};
}

std::size_t EtcdClient::voting_members() {
  auto j = impl_->call("/v3/cluster/member/list", json::object());
  std::size_t n = 0;
  for (const auto& m : j.value("members", json::array())) n += m.value("isLearner", false) ? 0 : 1;
  return n;
}

void EtcdClient::revoke(std::int64_t lease) { impl_->call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}); }

std::chrono::steady_clock::time_point EtcdClient::last_sent() const { return impl_->sent; }

}  // namespace ddprun::rounds
