#pragma once
// The keep-alive ring of one round (the store backend's liveness): each member bumps its own
// counter r<R>/alive/<g> every interval and watches the next member's; a counter that has not
// moved for the liveness TTL is a lost member. One check at a time, on the time it is given, so
// that the store backend runs it on a thread and the simulator (tests/rounds/sim_*) on virtual time.

#include <functional>
#include <optional>

#include "backend.hpp"

namespace ddprun::rounds {

class KeepAliveRing {
 public:
  using Renewed = std::function<void(Clock::time_point sent)>;
  KeepAliveRing(Members m, std::chrono::milliseconds interval, std::chrono::milliseconds ttl,
                const TimeSource& time = TimeSource::real())
      : time_(time), m_(std::move(m)), interval_(interval), ttl_(ttl), changed_(time.now()),
        next_beat_(changed_ + interval) {
    watching_ = m_.group_world > 1;
  }

  // How often check() is called.
  std::chrono::milliseconds every() const { return std::max(interval_ / 4, std::chrono::milliseconds(50)); }

  // Bumps this member's counter; `renewed` is told when the request was sent.
  void beat(Connection& c, const Renewed& renewed) {
    auto sent = time_.now();
    c.add(round_key(m_.round, Name::alive, m_.group_rank), 1);
    if (renewed) renewed(sent);
  }

  // Beats when due and reads the next member's counter. Returns how long it was idle once it is
  // lost (once: then it is not watched any more). Throws what the connection throws.
  std::optional<double> check(Connection& c, const Renewed& renewed) {
    const int next = m_.next();
    auto now = time_.now();
    if (now >= next_beat_) {
      beat(c, renewed);
      next_beat_ = now + interval_;
    }
    if (!watching_) return std::nullopt;
    long long count = c.add(round_key(m_.round, Name::alive, next), 0);
    // Dated when the read returned: the member's last renewal may have been sent just before.
    const auto read_at = time_.now();
    if (count != seen_) {
      seen_ = count;
      changed_ = read_at;
    } else if (read_at - changed_ > ttl_) {
      watching_ = false;
      return std::chrono::duration<double>(read_at - changed_).count();
    }
    return std::nullopt;
  }

  int round() const { return m_.round; }
  int next() const { return m_.next(); }

 private:
  const TimeSource& time_;
  Members m_;
  std::chrono::milliseconds interval_, ttl_;
  long long seen_ = -2;
  Clock::time_point changed_, next_beat_;
  bool watching_ = false;
};

}  // namespace ddprun::rounds
