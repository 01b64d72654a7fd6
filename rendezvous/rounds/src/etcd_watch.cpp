// The etcd client's watches: a stream of JSON messages over one HTTP response, moved to another
// member when the one it is on does not confirm it in time, has no leader, or breaks.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/error.hpp>
#include <functional>
#include <thread>

#include "ddprun/common/error.hpp"
#include "etcd_client.hpp"
#include "etcd_client_impl.hpp"

namespace ddprun::rounds {
namespace {

using namespace etcd_detail;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// The longest watch message taken (etcd's replies for a round are a few KiB).
constexpr std::size_t kMaxWatchMessage = 16u << 20;

// What a member said on a watch stream so far.
struct WatchSaid {
  std::vector<EtcdEvent> events;
  bool created = false;   // it confirmed the watch
  bool canceled = false;  // it ended the watch (a compacted revision): read the state anew
  std::string error;      // it refused the watch (no leader)
};

// A watch stream's JSON messages, split as bytes arrive (balanced braces; keys and values are
// base64, so no brace hides in a string). Each byte is looked at once: a message that never
// ends costs linear time, and what is buffered is bounded by the caller.
class MessageSplitter {
 public:
  void feed(const char* data, std::size_t n, WatchSaid& said) {
    text_.append(data, n);
    std::size_t used = 0;
    for (; pos_ < text_.size(); ++pos_) {
      char c = text_[pos_];
      if (c == '}' && depth_ == 0) continue;  // a stray closing brace opens nothing
      if (c == '{' && depth_++ == 0) start_ = pos_;
      if (c != '}' || --depth_ != 0) continue;
      take(text_.substr(start_, pos_ - start_ + 1), said);
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
  static void take(const std::string& message, WatchSaid& said) {
    auto m = json::parse(message, nullptr, false);
    if (m.is_discarded()) return;
    if (m.contains("error")) {
      said.error = refused_of(m, 0).message;
      return;
    }
    auto r = m.contains("result") ? m["result"] : m;
    said.created = said.created || r.value("created", false);
    said.canceled = said.canceled || r.value("canceled", false);
    for (const auto& ev : r.value("events", json::array())) {
      said.events.push_back({ev.value("type", "") == "DELETE", kv_of(ev.value("kv", json::object()))});
    }
  }
  std::string text_;
  std::size_t pos_ = 0, start_ = 0;
  int depth_ = 0;
};

}  // namespace

struct EtcdClient::Impl::WatchRead {
  WatchSaid said;
  std::string broke;  // why the member is left before the deadline (empty: it served the watch)
  // It confirmed the watch and held it to the deadline with no event, uninterrupted.
  bool quiet(Clock::time_point deadline) const {
    return broke.empty() && said.created && said.events.empty() && !said.canceled && Clock::now() >= deadline;
  }
};

// Reads until the first events arrive or `deadline` (then none). A member that has not
// confirmed the watch by `answer_by`, refuses it, or whose stream ends, is `broke`.
EtcdClient::Impl::WatchRead EtcdClient::Impl::read_watch(EtcdStream& s, const EtcdEndpoint& e, Request req,
                                                         Clock::time_point answer_by, Clock::time_point deadline) {
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  beast::flat_buffer buf;
  MessageSplitter messages;
  WatchRead out;
  bool oversized = false;
  std::string malformed;  // why a message could not be read (thrown out of no handler)
  char chunk[16384];
  asio::steady_timer answer(io);
  std::function<void(boost::system::error_code, std::size_t)> on_read;
  auto read_more = [&] {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    s.async_read_some(buf, parser, on_read);
  };
  auto done = [&](std::string why) {
    if (out.broke.empty()) out.broke = std::move(why);
    answer.cancel();
  };
  on_read = [&](boost::system::error_code c, std::size_t) {
    if (c && c != http::error::need_buffer) return done(c == asio::error::operation_aborted ? "" : "its stream broke: " + c.message());
    try {
      messages.feed(chunk, sizeof(chunk) - parser.get().body().size, out.said);
    } catch (const std::exception& ex) {
      malformed = ex.what();
      return done("");
    }
    // A message never completed (a broken or hostile server) is not buffered without bound.
    if (messages.buffered() > kMaxWatchMessage) oversized = true;
    if (oversized || !out.said.events.empty() || out.said.canceled) return done("");
    if (!out.said.error.empty()) return done("it refused the watch: " + out.said.error);
    if (parser.is_done()) return done("it ended the watch stream");
    read_more();
  };
  answer.expires_at(answer_by);
  answer.async_wait([&](boost::system::error_code c) {
    if (c || out.said.created) return;
    out.broke = "it did not confirm the watch in time";
    s.cancel();
  });
  s.async_write(req, [&](boost::system::error_code c, std::size_t) {
    if (c) return done(c == asio::error::operation_aborted ? "" : "sending the watch: " + c.message());
    read_more();
  });
  // Every handler above completes inside this run (they refer to this frame): an interrupt that
  // came before it cancels what was started, and none throws.
  watching = &s;
  if (interrupted) s.cancel();
  s.run(io, deadline);
  watching = nullptr;
  if (!malformed.empty()) throw ProtocolError("etcd at " + where(e) + " sent a watch message that is not etcd's: " + malformed);
  if (oversized) {
    throw ProtocolError("etcd at " + where(e) + " sent a watch message of over " + std::to_string(kMaxWatchMessage) +
                        " bytes (not etcd's gateway?)");
  }
  return out;
}

// Members are tried in turn until one serves the watch: each has `attempt` (then twice that,
// each time round) to confirm it. None by `limit`: no events (the caller reads the state anew;
// its reads say whether etcd can be reached at all).
std::vector<EtcdEvent> EtcdClient::watch(const std::string& key, bool prefix, std::int64_t from,
                                         std::chrono::milliseconds limit, bool* quiet) {
  auto& im = *impl_;
  if (quiet) *quiet = false;
  if (im.interrupted) return {};
  json create = {{"key", b64(key)}, {"start_revision", std::to_string(from)}};
  if (prefix) create["range_end"] = b64(prefix_end(key));
  const auto deadline = Impl::Clock::now() + limit;
  const std::size_t first = im.current;
  auto share = im.first_share();
  for (;;) {
    if (im.interrupted) return {};  // also while no member serves it: a stop is not kept waiting
    const auto& e = im.opt.endpoints[im.current];
    std::string why;
    try {
      auto answer_by = std::min(deadline, Impl::Clock::now() + share);
      im.authenticate(e, im.auth_deadline());
      auto s = im.connect(e, answer_by);
      auto req = im.request(e, "/v3/watch", {{"create_request", create}});
      req.set("Grpc-Metadata-hasleader", "true");  // etcd's require-leader: no watch on a member cut off
      auto r = im.read_watch(s, e, std::move(req), answer_by, deadline);
      if (quiet) *quiet = r.quiet(deadline);
      if (r.broke.empty() || im.interrupted) return std::move(r.said.events);
      why = r.broke;
    } catch (const ProtocolError&) {
      throw;
    } catch (const Error& err) {
      why = err.what();
    }
    spdlog::debug("ddprun: etcd watch on {}: {}; trying the next member", where(e), why);
    im.next_member();
    auto now = Impl::Clock::now();
    if (now >= deadline || im.interrupted) return {};
    if (im.current == first) {
      share = std::min(share * 2, im.most());
      std::this_thread::sleep_for(std::min<Impl::Clock::duration>(50ms, deadline - now));
    }
  }
}

// The flag first: a watch or request not yet started returns at once. Then the stream being read
// (if any: the handler runs on the watching thread, inside its run) is cancelled; a request
// waiting for its answer is woken by the handler and finds the flag.
void EtcdClient::interrupt() {
  auto& im = *impl_;
  im.interrupted = true;
  asio::post(im.io, [&im] {
    if (im.watching) im.watching->cancel();
  });
}

}  // namespace ddprun::rounds
