// How one request reaches etcd: the members asked in turn, each within its share of the call's
// time, the requests already sent kept waiting for while the call has time, the first answer
// counting (EtcdClient::Impl::call). The requests themselves are in etcd_client.cpp.
#include <algorithm>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "etcd_client_impl.hpp"
#include "etcd_transport.hpp"

namespace ddprun::rounds {

using namespace etcd_detail;
namespace beast = boost::beast;
namespace http = beast::http;
using namespace std::chrono_literals;

std::chrono::milliseconds EtcdClient::Impl::most() const {
  return std::clamp<std::chrono::milliseconds>(opt.timeout / 3, 300ms, 2000ms);
}

std::chrono::milliseconds EtcdClient::Impl::first_share() const {
  return opt.attempt > 0ms ? std::min(opt.attempt, most()) : most();
}

// A login checks the password with bcrypt, slow on purpose (hundreds of ms on a busy member):
// it is given 2 s (or the most a member gets), not one attempt. Once per client.
EtcdClient::Impl::Clock::time_point EtcdClient::Impl::auth_deadline() const {
  return Clock::now() + std::max<std::chrono::milliseconds>(most(), 2s);
}

EtcdClient::Impl::Request EtcdClient::Impl::request(const EtcdEndpoint& e, const std::string& path, const json& body) {
  Request req{http::verb::post, path, 11};
  req.set(http::field::host, where(e));
  req.set(http::field::content_type, "application/json");
  if (!token.empty()) req.set(http::field::authorization, token);
  req.body() = body.dump();
  req.prepare_payload();
  return req;
}

void EtcdClient::Impl::start(Attempt& a, const std::string& path, const json& body) {
  const auto& e = opt.endpoints[a.member];
  a.req = request(e, path, body);
  a.sent = Clock::now();
  // The kept connection serves this request if it was answered on lately and the member has not
  // closed it since (it restarted): a look at the socket, before anything is sent, so that no
  // request is sent twice. A connection idle longer may have been dropped on the way without a
  // word (a NAT or firewall forgetting it): a new one costs less than a wait.
  auto& k = kept[a.member];
  if (k.s && (a.sent - k.used > kKeptIdle || !k.s->open_while_idle())) k.s.reset();
  if (k.s) {
    a.s = std::move(k.s);
    k.s.reset();
    return exchange(a);
  }
  try {
    a.s.emplace(EtcdStream::make(io, e, tls.get()));
  } catch (const Error& err) {  // the name did not resolve
    a.failed = err.what();
    a.done = true;
    return;
  }
  a.s->async_connect([this, &a](std::string why) {
    if (why.empty() && !a.cancelled) return exchange(a);
    if (!a.cancelled) a.failed = std::move(why);
    a.done = true;
  });
}

void EtcdClient::Impl::exchange(Attempt& a) {
  a.connected = true;
  auto failed = [this, &a](boost::system::error_code ec) {
    if (!a.cancelled) a.failed = "talking to " + where(opt.endpoints[a.member]) + ": " + a.s->explain(ec);
    a.done = true;
  };
  a.s->async_write(a.req, [&a, failed](boost::system::error_code ec, std::size_t) {
    if (ec || a.cancelled) return failed(ec);
    a.s->async_read(a.buf, a.res, [&a, failed](boost::system::error_code r, std::size_t) {
      if (r) return failed(r);
      a.done = true;
    });
  });
}

void EtcdClient::Impl::wait_any(std::list<Attempt>& live, Clock::time_point until) {
  auto any = [&live] { return std::any_of(live.begin(), live.end(), [](const Attempt& a) { return a.done; }); };
  if (live.empty()) {
    while (!interrupted && Clock::now() < until) std::this_thread::sleep_for(std::min<Clock::duration>(20ms, until - Clock::now()));
    return;
  }
  io.restart();
  while (!any() && !interrupted && Clock::now() < until && io.run_one_until(until) > 0) {
  }
  io.restart();
  for (int i = 0; i < 64 && !any() && io.poll_one() > 0;) ++i;
}

// Closed, not only cancelled: a step that completed before (its handler queued behind the answer
// that ended the wait, on a thread kept off the CPU) then fails at once instead of starting the
// next on a member that may never answer.
void EtcdClient::Impl::cancel(std::list<Attempt>& live) {
  for (auto& a : live) {
    if (a.done) continue;
    a.cancelled = true;
    if (a.s) a.s->close();
  }
  io.restart();
  while (std::any_of(live.begin(), live.end(), [](const Attempt& a) { return !a.done; })) {
    if (io.run_one() == 0) {  // nothing left to run: none of them has a step pending
      for (auto& a : live) a.done = true;
    }
  }
}

json EtcdClient::Impl::outcome(Attempt& a) {
  const auto& e = opt.endpoints[a.member];
  if (a.cancelled) throw TimeoutError(a.connected ? "no answer from " + where(e) + " in time" : a.s->connect_timeout_text());
  if (!a.failed.empty()) throw NetworkError(a.failed);
  auto& res = a.res;
  if (res.keep_alive()) kept[a.member] = {std::move(a.s), Clock::now()};
  auto j = json::parse(res.body(), nullptr, false);
  if (j.is_discarded()) throw NetworkError(where(e) + " answered with something other than JSON (not etcd's gateway?)");
  if (res.result() != http::status::ok || j.contains("error")) throw refused_of(j, res.result_int());
  return j;
}

json EtcdClient::Impl::post(const EtcdEndpoint& e, const std::string& path, const json& body, Clock::time_point deadline) {
  std::list<Attempt> one(1);
  one.front().member = static_cast<std::size_t>(&e - opt.endpoints.data());
  start(one.front(), path, body);
  wait_any(one, deadline);
  cancel(one);
  return outcome(one.front());
}

void EtcdClient::Impl::authenticate(const EtcdEndpoint& e, Clock::time_point deadline) {
  if (opt.user.empty() || !token.empty()) return;
  auto j = post(e, "/v3/auth/authenticate", {{"name", opt.user}, {"password", opt.password}}, deadline);
  token = j.value("token", "");
}

// A member gets a share of the call's time: one that is paused, cut off, or without a leader
// holds a request until etcd's own time-out (seconds), while another may already serve it. So
// when a member has not answered within its share, the next is asked too, and the first answer
// counts: a request already sent is not given up on while the call has time (an overloaded
// cluster answers late; giving up and sending again would add the work it is behind with). One
// that refuses or breaks the connection is passed at once. The first time round the members each
// gets `attempt`; each time round again (after those that failed), twice that, up to a third of
// the call's time. A member is asked once at a time.
// One call's members: which have the request (in `live`), which were asked this time round, and
// what each failed with.
struct EtcdClient::Impl::Call {
  Impl& im;
  const std::string& path;
  const json& body;
  const std::chrono::milliseconds patient, limit;
  const Clock::time_point deadline;
  const std::size_t n;
  std::chrono::milliseconds share;
  std::vector<std::string> errors;
  std::vector<bool> asked;
  std::list<Attempt> live;  // the requests in flight, one a member at most
  Clock::time_point next_at;  // when the next member is asked
  std::size_t next;
  int rounds = 0;

  Call(Impl& i, const std::string& p, const json& b, std::chrono::milliseconds pat)
      : im(i), path(p), body(b), patient(pat), limit(pat > 0ms ? pat : i.opt.timeout), deadline(Clock::now() + limit),
        n(i.opt.endpoints.size()), share(pat > 0ms ? pat : i.first_share()), errors(n), asked(n, false),
        next_at(Clock::now()), next(i.current) {}
  // However the call ends, what is still in flight is cancelled before `live` goes: its handlers
  // hold the attempts' addresses.
  ~Call() { im.cancel(live); }

  // The call's time is up, or (patient) its one member failed: one that refused or broke the
  // connection is left, the patience is for a slow member.
  bool over(Clock::time_point now) const {
    return now >= deadline || (patient > 0ms && asked[im.current] && live.empty());
  }

  void refused(std::size_t m, const Refused& r) {
    const auto& e = im.opt.endpoints[m];
    if (r.auth) throw AuthError("etcd at " + where(e) + " refused ddprun: " + r.message + " (check --rdzv_conf user, password)");
    if (!r.transient) throw Error("etcd at " + where(e) + ": " + r.message);
    errors[m] = r.message;
  }

  // The next member not asked this time round; when every member has the request, none (the
  // first answer counts); when some failed, after a pause they are asked again (etcd may be
  // electing a leader), each with twice the share.
  void ask(Clock::time_point now) {
    if (patient > 0ms && asked[im.current]) return;
    std::size_t m = n;
    for (std::size_t i = 0; i < n && m == n; ++i) m = asked[(next + i) % n] ? m : (next + i) % n;
    if (m == n && live.size() == n) {
      next_at = deadline;
      return;
    }
    if (m == n) {
      asked.assign(n, false);
      for (const auto& a : live) asked[a.member] = true;
      share = std::min(share * 2, im.most());
      next_at = now + std::min<Clock::duration>(std::min<std::chrono::milliseconds>(50ms * ++rounds, 250ms), deadline - now);
      return;
    }
    asked[m] = true;
    next = (m + 1) % n;
    next_at = now;  // where this member cannot be asked, the next at once
    try {
      im.authenticate(im.opt.endpoints[m], im.auth_deadline());
      live.emplace_back().member = m;
      im.start(live.back(), path, body);
      next_at = now + share;
    } catch (const Refused& r) {
      refused(m, r);
    } catch (const Error& err) {
      errors[m] = err.what();
    }
  }

  // The first answer, if one came; members that failed are recorded and no longer in flight.
  std::optional<json> answers() {
    for (auto it = live.begin(); it != live.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      const std::size_t m = it->member;
      try {
        auto j = im.outcome(*it);
        // The member that answered is asked first next time; connections kept to the others
        // would only hold a descriptor on each side.
        for (std::size_t i = 0; i < n; ++i) {
          if (i != m) im.kept[i].s.reset();
        }
        im.current = m;
        im.sent = it->sent;
        return j;
      } catch (const Refused& r) {
        refused(m, r);
      } catch (const Error& err) {
        errors[m] = err.what();
      }
      it = live.erase(it);
      next_at = Clock::now();  // the next member at once
    }
    return std::nullopt;
  }

  // What every member failed with; UnansweredError where each took the connection (a TLS
  // handshake under way counts: a busy member answers that no sooner, unless an earlier try's
  // handshake with it failed) and none answered.
  [[noreturn]] void fail() {
    const bool unanswered = live.size() == n && std::all_of(live.begin(), live.end(), [this](const Attempt& a) {
      return a.connected || (a.s && a.s->handshake_begun() && errors[a.member].empty());
    });
    im.cancel(live);
    for (auto& a : live) {
      // A member's last try may run out of the call's time: what an earlier try found (a TLS
      // failure, a refused connection) says more.
      if (!errors[a.member].empty()) continue;
      try {
        im.outcome(a);
      } catch (const Error& err) {
        errors[a.member] = err.what();
      }
    }
    im.current = next % n;
    std::string list, why;
    for (std::size_t i = 0; i < n; ++i) {
      list += (i ? ", " : "") + where(im.opt.endpoints[i]);
      if (!errors[i].empty()) why += (why.empty() ? "" : "; ") + where(im.opt.endpoints[i]) + ": " + errors[i];
    }
    const auto text = "cannot reach etcd at " + list + " within " + duration_text(limit) + ": " + why;
    if (unanswered) throw UnansweredError(text);
    throw NetworkError(text);
  }
};

json EtcdClient::Impl::call(const std::string& path, const json& body, std::chrono::milliseconds patient) {
  Call c(*this, path, body, patient);
  for (;;) {
    if (interrupted) throw Error("the etcd request was given up: ddprun is stopping");
    const auto now = Clock::now();
    if (c.over(now)) c.fail();
    if (now >= c.next_at) c.ask(now);
    wait_any(c.live, std::min(c.next_at, c.deadline));
    if (auto j = c.answers()) return *j;
  }
}

}  // namespace ddprun::rounds
