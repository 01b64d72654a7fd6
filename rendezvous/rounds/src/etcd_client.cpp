#include "etcd_client.hpp"

#include <openssl/evp.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "etcd_transport.hpp"

namespace ddprun::rounds {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The longest watch message taken (etcd's replies for a round are a few KiB); an answer of
// another request over Beast's default body limit (8 MiB) is refused the same way.
constexpr std::size_t kMaxWatchMessage = 16u << 20;

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

// The end of the key range holding every key under `prefix` (etcd's convention).
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
  return kv;
}

std::string where(const EtcdEndpoint& e) { return format_address(e.host, e.port); }

// A watch stream's JSON messages, split as bytes arrive (balanced braces; keys and values are
// base64, so no brace hides in a string). Each byte is looked at once: a message that never
// ends costs linear time, and what is buffered is bounded by the caller.
class MessageSplitter {
 public:
  void feed(const char* data, std::size_t n, std::vector<EtcdEvent>& events) {
    text_.append(data, n);
    std::size_t used = 0;
    for (; pos_ < text_.size(); ++pos_) {
      char c = text_[pos_];
      if (c == '}' && depth_ == 0) continue;  // a stray closing brace opens nothing
      if (c == '{' && depth_++ == 0) start_ = pos_;
      if (c != '}' || --depth_ != 0) continue;
      take(text_.substr(start_, pos_ - start_ + 1), events);
      used = pos_ + 1;
    }
    if (used > 0) {
      text_.erase(0, used);
      pos_ -= used;
      start_ = start_ >= used ? start_ - used : 0;
    }
  }
  std::size_t buffered() const { return text_.size(); }

 private:
  static void take(const std::string& message, std::vector<EtcdEvent>& events) {
    auto m = json::parse(message, nullptr, false);
    if (m.is_discarded()) return;
    auto r = m.contains("result") ? m["result"] : m;
    for (const auto& ev : r.value("events", json::array())) {
      events.push_back({ev.value("type", "") == "DELETE", kv_of(ev.value("kv", json::object()))});
    }
  }
  std::string text_;
  std::size_t pos_ = 0, start_ = 0;
  int depth_ = 0;
};

// An error etcd returned: worth another member (no leader, leader changed, unavailable) or not.
struct Refused {
  std::string message;
  bool transient;
  bool auth;
};

}  // namespace

struct EtcdClient::Impl {
  EtcdOptions opt;
  std::shared_ptr<asio::ssl::context> tls;  // set when an endpoint uses TLS
  std::size_t current = 0;
  std::string token;
  asio::io_context io;

  EtcdStream connect(const EtcdEndpoint& e, Clock::time_point deadline) {
    return EtcdStream::open(io, e, tls.get(), deadline);
  }
  std::vector<EtcdEvent> read_watch(EtcdStream& s, const EtcdEndpoint& e, http::request<http::string_body> req,
                                    Clock::time_point deadline);

  http::request<http::string_body> request(const EtcdEndpoint& e, const std::string& path, const json& body) {
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, where(e));
    req.set(http::field::content_type, "application/json");
    if (!token.empty()) req.set(http::field::authorization, token);
    req.body() = body.dump();
    req.prepare_payload();
    return req;
  }

  // One request to one member. Throws NetworkError/TimeoutError (try another) or Refused.
  json post(const EtcdEndpoint& e, const std::string& path, const json& body, Clock::time_point deadline) {
    auto s = connect(e, deadline);
    auto req = request(e, path, body);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    boost::system::error_code ec;
    s.visit([&](auto& stream) {
      http::async_write(stream, req, [&](boost::system::error_code c, std::size_t) {
        ec = c;
        if (!c) http::async_read(stream, buf, res, [&](boost::system::error_code r, std::size_t) { ec = r; });
      });
    });
    if (!s.run(io, deadline)) throw TimeoutError("no answer from " + where(e) + " in time");
    if (ec) throw NetworkError("talking to " + where(e) + ": " + s.explain(ec));
    auto j = json::parse(res.body(), nullptr, false);
    if (j.is_discarded()) throw NetworkError(where(e) + " answered with something other than JSON (not etcd's gateway?)");
    if (res.result() != http::status::ok || j.contains("error")) {
      std::string msg = j.value("message", j.value("error", std::string("HTTP ") + std::to_string(res.result_int())));
      int code = j.value("code", 0);
      bool auth = code == 16 || code == 7 || msg.find("authenticat") != std::string::npos ||
                  msg.find("permission denied") != std::string::npos || msg.find("user name") != std::string::npos;
      bool transient = code == 14 || code == 4 || msg.find("leader") != std::string::npos ||
                       msg.find("unavailable") != std::string::npos || msg.find("timed out") != std::string::npos;
      throw Refused{msg, transient, auth};
    }
    return j;
  }

  void authenticate(const EtcdEndpoint& e, Clock::time_point deadline) {
    if (opt.user.empty() || !token.empty()) return;
    auto j = post(e, "/v3/auth/authenticate", {{"name", opt.user}, {"password", opt.password}}, deadline);
    token = j.value("token", "");
  }

  // The request on the current member, moving on to the next when one cannot serve it.
  json call(const std::string& path, const json& body) {
    const auto deadline = Clock::now() + opt.timeout;
    // One member gets a share of the time: one without a leader (after its leader died) holds
    // a request until etcd's own time-out, while another may already serve it.
    const auto share = std::clamp(opt.timeout / 3, std::chrono::milliseconds(300), std::chrono::milliseconds(2000));
    std::vector<std::string> errors(opt.endpoints.size());
    for (std::size_t attempt = 0;; ++attempt) {
      const auto& e = opt.endpoints[current];
      try {
        auto until = std::min(deadline, Clock::now() + share);
        authenticate(e, until);
        return post(e, path, body, until);
      } catch (const Refused& r) {
        if (r.auth) throw AuthError("etcd at " + where(e) + " refused ddprun: " + r.message + " (check --rdzv_conf user, password)");
        if (!r.transient) throw Error("etcd at " + where(e) + ": " + r.message);
        errors[current] = r.message;
      } catch (const TimeoutError& err) {
        // The last try of a member may run out of the call's time: what an earlier try found
        // (a TLS failure, a refused connection) says more.
        if (errors[current].empty()) errors[current] = err.what();
      } catch (const Error& err) {
        errors[current] = err.what();
      }
      current = (current + 1) % opt.endpoints.size();
      if (Clock::now() >= deadline) break;
      if (current == 0) std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::size_t>(50 * attempt, 250)));
    }
    std::string list, why;
    for (std::size_t i = 0; i < opt.endpoints.size(); ++i) {
      list += (i ? ", " : "") + where(opt.endpoints[i]);
      if (!errors[i].empty()) why += (why.empty() ? "" : "; ") + where(opt.endpoints[i]) + ": " + errors[i];
    }
    throw NetworkError("cannot reach etcd at " + list + " within " + duration_text(opt.timeout) + ": " + why);
  }
};

EtcdClient::EtcdClient(EtcdOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.endpoints.empty()) throw UsageError("no etcd endpoint given");
  check_etcd_tls(options.endpoints, options.tls);
  if (options.tls.enabled()) impl_->tls = make_tls_context(options.tls);
  impl_->opt = std::move(options);
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

std::int64_t EtcdClient::grant_lease(std::chrono::seconds ttl) {
  auto j = impl_->call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}});
  return num(j, "ID");
}

bool EtcdClient::keep_alive(std::int64_t lease) {
  auto j = impl_->call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  auto r = j.contains("result") ? j["result"] : j;
  return num(r, "TTL") > 0;
}

EtcdClient::Status EtcdClient::status() {
  auto j = impl_->call("/v3/maintenance/status", json::object());
  auto id = [&](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  return {id(j["header"].value("member_id", json(""))), id(j.value("leader", json("")))};
}

void EtcdClient::revoke(std::int64_t lease) { impl_->call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}); }

std::vector<EtcdEvent> EtcdClient::watch(const std::string& key, bool prefix, std::int64_t from,
                                         std::chrono::milliseconds limit) {
  auto& im = *impl_;
  json create = {{"key", b64(key)}, {"start_revision", std::to_string(from)}};
  if (prefix) create["range_end"] = b64(prefix_end(key));
  const auto deadline = Clock::now() + limit;
  // A member that cannot be reached is skipped for the next one (once round).
  std::optional<EtcdStream> stream;
  for (std::size_t tried = 0; !stream; ++tried) {
    try {
      stream.emplace(im.connect(im.opt.endpoints[im.current], deadline));
    } catch (const Error&) {
      im.current = (im.current + 1) % im.opt.endpoints.size();
      if (tried + 1 >= im.opt.endpoints.size() || Clock::now() >= deadline) throw;
    }
  }
  const auto& e = im.opt.endpoints[im.current];
  return im.read_watch(*stream, e, im.request(e, "/v3/watch", {{"create_request", create}}), deadline);
}

// The answer to a watch is a stream of JSON messages (chunked): "created", then events as they
// happen. Read until the first events arrive or `deadline` (then none: empty); a stream that
// breaks ends the wait early, and the caller watches again.
std::vector<EtcdEvent> EtcdClient::Impl::read_watch(EtcdStream& s, const EtcdEndpoint& e,
                                                    http::request<http::string_body> req, Clock::time_point deadline) {
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  beast::flat_buffer buf;
  MessageSplitter messages;
  std::vector<EtcdEvent> events;
  bool oversized = false;
  char chunk[16384];
  std::function<void(boost::system::error_code, std::size_t)> on_read;
  auto read_more = [&] {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    s.visit([&](auto& stream) { http::async_read_some(stream, buf, parser, on_read); });
  };
  on_read = [&](boost::system::error_code c, std::size_t) {
    if (c && c != http::error::need_buffer) return;
    messages.feed(chunk, sizeof(chunk) - parser.get().body().size, events);
    // A message never completed (a broken or hostile server) is not buffered without bound.
    if (messages.buffered() > kMaxWatchMessage) {
      oversized = true;
      return;
    }
    if (events.empty() && !parser.is_done()) read_more();
  };
  s.visit([&](auto& stream) {
    http::async_write(stream, req, [&](boost::system::error_code c, std::size_t) {
      if (!c) read_more();
    });
  });
  s.run(io, deadline);
  if (oversized) {
    throw ProtocolError("etcd at " + where(e) + " sent a watch message of over " + std::to_string(kMaxWatchMessage) +
                        " bytes (not etcd's gateway?)");
  }
  return events;
}

}  // namespace ddprun::rounds
