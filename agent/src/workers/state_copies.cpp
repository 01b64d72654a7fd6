#include "workers/state_copies.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "workers/state_area_io.hpp"
#include "workers/state_areas.hpp"

namespace ddprun::agent {
namespace sl = ddprun::state_layout;
using area_io::get_u64;
using area_io::put_u64;
namespace {

using namespace std::chrono_literals;

// Every rank's buddy holds `step`: it is marked done. Its count is read no more, nor is an older
// step's mark: an agent counts a rank's newer step only once its older one is done or written
// over, so once every rank counted `step`, no agent waits for an older one. Both are deleted: the
// workers' store holds a few of these keys however long the job runs, not two a step.
// The newest step done is raised to `step` before its mark is set: no later step can be done
// before every agent has seen that mark, so a later step's raise finds this one and deletes its
// mark (set first, a later step could be done and raised between the two, leaving it behind).
void mark_done(rendezvous::TcpStore& store, const std::string& prefix, std::int64_t step) {
  const auto done = [&](std::int64_t s) { return fmt::format("{}done/{}", prefix, s); };
  const std::string key = prefix + "done", mine = std::to_string(step);
  std::string current;  // the newest step done before this one ("": none), raised to this one
  std::optional<long long> older;
  for (int tries = 0; tries < 8; ++tries) {
    const auto newest = parse_int(current);
    if (newest && *newest >= step) break;  // a newer step was done first: this mark stays (steps went back)
    const std::string now = store.compare_set(key, current, mine);
    if (now == mine) {
      older = newest;
      break;
    }
    current = now;
  }
  store.set(done(step), "1");
  store.delete_key(fmt::format("{}step/{}", prefix, step));
  if (older) store.delete_key(done(*older));
}

// A round's copy key, made once, where first needed (a copy sent, served or fetched): a round in
// which no state moves never asks for it.
class CopyKey {
 public:
  explicit CopyKey(std::function<std::string()> make) : make_(std::move(make)) {}
  std::string operator()() {
    std::lock_guard<std::mutex> lk(mu_);
    if (key_.empty()) key_ = make_();
    return key_;
  }

 private:
  std::mutex mu_;
  std::function<std::string()> make_;
  std::string key_;
};

}  // namespace

struct StateCopies::Round {
  rounds::RoundInfo info;
  std::function<void()> ready;
  std::string prefix, buddy;        // the round's keys' prefix, the buddy's address ("": none)
  std::function<std::string()> key;  // the round's copy key
  std::string at(const std::string& what) const { return prefix + what; }
};

StateCopies::StateCopies(const StateAreas& areas, std::string host, std::uint64_t bytes_per_s, std::uint64_t budget,
                         std::string secret, std::string run_id)
    : areas_(areas), bytes_per_s_(bytes_per_s), secret_(std::move(secret)), run_id_(std::move(run_id)),
      server_(budget), placement_(areas, server_, std::move(host)) {}

StateCopies::~StateCopies() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  sending_ = -1;
  cancel_ = true;
  cut_in_flight();
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

rounds::StateOffer StateCopies::offer() {
  if (!server_.started()) server_.start();
  return rounds::StateOffer{placement_.here(), placement_.holds()};
}

void StateCopies::prepare(const rounds::RoundInfo& info, std::function<void()> ready) {
  if (!thread_.joinable()) {
    thread_ = start_thread("the thread of the workers' state copies", [this] { run(); });
  }
  auto r = std::make_unique<Round>();
  r->info = info;
  r->ready = std::move(ready);
  r->prefix = fmt::format("ddprun/state/{}/", info.round);
  {
    std::lock_guard<std::mutex> lk(mu_);
    next_ = std::move(r);
    sending_ = info.round;
    cancel_ = true;  // the last round's copy in flight, if any
  }
  cut_in_flight();
  wake_.notify_all();
}

void StateCopies::stop_sending() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    sending_ = -1;
    cancel_ = true;
  }
  cut_in_flight();
  wake_.notify_all();  // a pause between looks ends at once
}

void StateCopies::pause(int round, std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lk(mu_);
  wake_.wait_for(lk, d, [&] { return stop_.load() || sending_.load() != round || next_ != nullptr; });
}

void StateCopies::cut_in_flight() {
  std::lock_guard<std::mutex> lk(in_flight_mu_);
  if (in_flight_fd_ >= 0) ::shutdown(in_flight_fd_, SHUT_RDWR);  // its blocked send or receive ends at once
}

StateCopies::InFlight::InFlight(StateCopies& c, int fd) : copies(c) {
  std::lock_guard<std::mutex> lk(c.in_flight_mu_);
  c.in_flight_fd_ = fd;
  if (c.cancel_) ::shutdown(fd, SHUT_RDWR);
}

StateCopies::InFlight::~InFlight() {
  std::lock_guard<std::mutex> lk(copies.in_flight_mu_);
  copies.in_flight_fd_ = -1;
}

bool StateCopies::wanted(int round) const {
  if (stop_.load() || sending_.load() != round) return false;
  std::lock_guard<std::mutex> lk(mu_);
  return !next_;
}

void StateCopies::run() {
  for (;;) {
    std::unique_ptr<Round> r;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stop_.load() || next_ != nullptr; });
      if (stop_) return;
      r = std::move(next_);
      cancel_ = false;
    }
    try {
      settle(*r);
    } catch (const std::exception& e) {
      spdlog::warn("ddprun: round {}: the workers' in-memory state was not put in place for their ranks ({}); "
                   "a rank whose state was elsewhere starts without it",
                   r->info.round, e.what());
      areas_.begin_course(r->info.round);  // (where settle() failed before its Arm did)
    }
    if (!wanted(r->info.round)) continue;  // a newer round, or the end: its workers never start
    r->ready();
    try {
      send(*r);
    } catch (const std::exception& e) {
      if (wanted(r->info.round)) {
        spdlog::warn("ddprun: round {}: copies of the workers' state to the buddy node stopped: {}", r->info.round,
                     e.what());
      }
    }
  }
}

// Each area's state put in place for its rank (StatePlacement), the round's copy key told to the
// server; the round's copies armed however it ends. The round's workers' store is asked only
// where state moves: a round whose members hold none, and whose workers have saved none yet,
// costs that store nothing here.
void StateCopies::settle(Round& r) {
  const auto& info = r.info;
  rendezvous::TcpStoreOptions o;
  o.host = info.store_host;
  o.port = info.store_port;
  o.timeout = 10s;
  // The round's copy key: derived from the job's secret where it has one (it never crosses the
  // wire), else the first agent's random key in the workers' store (as private as that store).
  auto key = std::make_shared<CopyKey>(
      [o, at = r.at("key"), secret = secret_, label = fmt::format("{}/{}", run_id_, info.round)]() mutable {
        if (!secret.empty()) return derive_key(secret, label);
        o.timeout = 3s;  // (asked for by a copy or a connection: a store lost is not waited for long; asked again)
        return rendezvous::TcpStore(o).compare_set(at, "", random_hex(64));
      });
  r.key = [key] { return (*key)(); };
  r.buddy = info.next_state_link;
  if (r.buddy.empty() && info.group_world > 1 && bytes_per_s_ > 0) {
    spdlog::warn("ddprun: round {}: the next node offers no copies of the workers' state (it runs without the "
                 "state, or its copy server failed to start): this node's ranks' states are not copied, and the saves "
                 "wait for the copies only until they give up",
                 info.round);
  }
  server_.set_key(r.key);
  server_.set_round(info.round);
  for (int i = 0; i < areas_.ranks(); ++i) put_u64(areas_.fd(i), sl::kCopiesAt, 0);  // until the round's copies start
  // However the settling ends (an error included), the round's copies are armed.
  struct Arm {
    StateCopies& self;
    const rounds::RoundInfo& info;
    ~Arm() { self.arm(info); }
  } arm{*this, info};
  std::unique_ptr<rendezvous::TcpStore> store;  // connected where first needed
  auto connect = [&]() -> rendezvous::TcpStore& {
    if (!store) store = std::make_unique<rendezvous::TcpStore>(o);
    return *store;
  };
  placement_.settle(info, StatePlacement::RoundKeys{r.prefix, r.key, connect, [&] { return wanted(info.round); }});
}

// The state each area holds as settling ends counts as replicated (the copies held, until the
// round's first replicated step, cover it): the round's first save goes on at once, the next
// waits for it, at most the hold limit.
void StateCopies::arm(const rounds::RoundInfo& info) noexcept {
  const bool copies = info.group_world > 1 && bytes_per_s_ > 0;
  areas_.begin_course(info.round);  // before the replicated mark: the round's first save is not held
  try {
    const auto limit = static_cast<std::uint64_t>(std::chrono::duration<double>(give_up()).count()) + 30;
    const auto slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
    for (int i = 0; i < areas_.ranks(); ++i) {
      const int fd = areas_.fd(i);
      // The newest generation the area holds or held (a worker killed between a slot's commit
      // and the header's latest leaves the latter behind), the round's course's start at least.
      std::uint64_t newest = get_u64(fd, sl::kLatestAt) >> 1;
      for (std::uint32_t k = 0; k < sl::kSlots; ++k) {
        const std::uint64_t at = sl::page() + k * slot_bytes;
        if (get_u64(fd, at) != 0) newest = std::max(newest, get_u64(fd, at + 8));
      }
      put_u64(fd, sl::kReplicatedAt, newest);
      put_u64(fd, sl::kHoldLimitAt, limit);
      put_u64(fd, sl::kCopiesAt, copies ? 1 : 0);
    }
  } catch (const std::exception&) {
  }
}

std::chrono::steady_clock::duration StateCopies::give_up() const {
  // A step is replicated once every rank's buddy holds it: all of a node's ranks cross the link
  // one after the other, as do the buddy's own. This long (three times the node's newest states
  // at the pace, and 10 s) before the saves stop waiting for the copies (until a step is
  // replicated again).
  const auto slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  double node = 0;
  std::vector<unsigned char> head(sl::page());
  for (int i = 0; i < areas_.ranks(); ++i) {
    const int fd = areas_.fd(i);
    area_io::read(fd, head.data(), sl::kHeaderBytes, 0);
    const auto latest = sl::header(head.data()).latest;
    area_io::read(fd, head.data(), head.size(), sl::page() + (latest & 1) * slot_bytes);
    const auto h = sl::slot_header(head.data());
    if (h.committed_within(slot_bytes)) node += static_cast<double>(sl::page() + h.payload());
  }
  return 10s + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(bytes_per_s_ ? 3.0 * node / static_cast<double>(bytes_per_s_) : 0.0));
}

// ---- sending: each new committed state to the buddy ---------------------------------------------

void StateCopies::send(Round& r) {
  const auto& info = r.info;
  const int round = info.round;
  const int n = areas_.ranks();
  // Whatever ends the copies, the saves stop waiting for them only while the round goes on
  // (where the copies gave up): at the end of the round a save still waiting would commit a step
  // that no buddy holds, ahead of the step the next round agrees on (whose settle lets go of it).
  struct Unpin {
    StateCopies& self;
    const StateAreas& areas;
    int round;
    ~Unpin() {
      if (!self.wanted(round)) return;
      for (int i = 0; i < areas.ranks(); ++i) {
        try {
          put_u64(areas.fd(i), sl::kCopiesAt, 0);
        } catch (const std::exception&) {
        }
      }
    }
  } unpin{*this, areas_, info.round};
  if (info.group_world < 2 || bytes_per_s_ == 0) return;  // no buddy, or no copies
  // The saves wait for a replicated step this long at most, whatever holds it back (a copy or the
  // count that fails, a buddy not known or out of room), before they stop waiting for the copies;
  // the bound follows the size of the state, and the workers' own (the header's hold limit) too.
  auto give_up = this->give_up();
  auto sized_at = std::chrono::steady_clock::now();
  Sending s{r,
            std::vector<std::uint64_t>(static_cast<std::size_t>(n)),
            std::vector<std::optional<std::int64_t>>(static_cast<std::size_t>(n)),
            std::vector<std::optional<Sending::Pending>>(static_cast<std::size_t>(n)),
            nullptr};
  for (int i = 0; i < n; ++i) s.sent[static_cast<std::size_t>(i)] = get_u64(areas_.fd(i), sl::kLatestAt) >> 1;
  std::optional<std::chrono::steady_clock::time_point> failing;
  std::chrono::steady_clock::time_point held{};  // since when the saves are held back ({}: they are not)
  // Idle (no new state, no step pending), the areas are looked at again after 5 ms; until a
  // state was copied this round, less and less often, up to every 100 ms, or every second while
  // this node has seen no state in the job: a node whose workers do not save costs next to
  // nothing (a fleet of a thousand agents on one machine once spent its CPU polling here), and
  // one whose workers save sends each save within 5 ms (the job's first within a second).
  constexpr std::chrono::milliseconds kIdleFirst{5};
  const std::chrono::milliseconds kIdleMost{placement_.seen_state() ? 100 : 1000};
  auto idle = kIdleFirst;
  while (wanted(round)) {
    // How long the saves have been held back (a newest state not yet replicated).
    bool holding = false;
    for (int i = 0; i < n && !holding; ++i) {
      const int fd = areas_.fd(i);
      holding = get_u64(fd, sl::kCopiesAt) == 1 && (get_u64(fd, sl::kLatestAt) >> 1) > get_u64(fd, sl::kReplicatedAt);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - sized_at > 1s) {
      sized_at = now;
      give_up = this->give_up();
      const auto limit = static_cast<std::uint64_t>(std::chrono::duration<double>(give_up).count()) + 30;
      for (int i = 0; i < n; ++i) put_u64(areas_.fd(i), sl::kHoldLimitAt, limit);
    }
    if (!holding) {
      held = {};
    } else if (held == std::chrono::steady_clock::time_point{}) {
      held = now;
    } else if (!s.unpinned && now - held > give_up) {
      s.unpin(areas_);
      spdlog::warn("ddprun: round {}: a save has waited {:.0f} s for its step to reach every rank's buddy (does "
                   "every rank save the same steps? is the buddy node out of room?); the saves stop waiting for "
                   "the copies until one does: a node lost meanwhile may lose its ranks' state",
                   round, std::chrono::duration<double>(now - held).count());
    }
    try {
      bool busy = false;
      if (s.store || has_new(s)) {  // connected once there is something to copy (made again after a failure)
        if (!s.store) {
          rendezvous::TcpStoreOptions o;
          o.host = info.store_host;
          o.port = info.store_port;
          o.timeout = 1s;  // its host lost, the next round's settle is not kept waiting long
          s.store = std::make_unique<rendezvous::TcpStore>(o);
        }
        busy = pass(s);
        s.copied = s.copied || busy;
      }
      if (busy) {
        idle = kIdleFirst;
      } else {
        pause(round, idle);
        if (!s.copied) idle = std::min<std::chrono::milliseconds>(2 * idle, kIdleMost);
      }
      failing.reset();
    } catch (const std::exception& e) {
      if (!wanted(round)) return;
      s.store.reset();
      if (!failing) {
        failing = now;
        spdlog::warn("ddprun: round {}: copying the workers' state to the buddy node failed ({}); trying again",
                     round, e.what());
      }
      pause(round, 200ms);
    }
  }
}

void StateCopies::Sending::unpin(const StateAreas& areas) {
  unpinned = true;
  for (int j = 0; j < areas.ranks(); ++j) put_u64(areas.fd(j), sl::kCopiesAt, 0);
}

bool StateCopies::has_new(const Sending& s) const {
  for (int i = 0; i < areas_.ranks(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (s.pending[u] || (get_u64(areas_.fd(i), sl::kLatestAt) >> 1) > s.sent[u]) return true;
  }
  return false;
}

// One pass: each area's new committed state sent and counted, then a wait for a step pending.
bool StateCopies::pass(Sending& s) {
  Round& r = s.round;
  if (s.owed_done) {
    mark_done(*s.store, r.prefix, *s.owed_done);
    s.owed_done.reset();
  }
  if (r.buddy.empty()) return false;  // the buddy offers no copies (its own failed to start)
  return send_new(s) || mark_replicated(s);
}

// Counts local rank u's pending state as sent (once per step and rank); the count that completes
// the step marks it done.
void StateCopies::count_sent(Sending& s, std::size_t u) {
  const Round& r = s.round;
  const auto& p = *s.pending[u];
  if (s.added[u] == p.step) return;
  const auto total = s.store->add(r.at(fmt::format("step/{}", p.step)), 1);
  s.added[u] = p.step;
  spdlog::debug("ddprun: round {}: rank {}'s state of step {} (generation {}) sent to {}; {} of {} ranks", r.info.round,
                r.info.rank_offset + static_cast<int>(u), p.step, p.gen, r.buddy, total, r.info.world_size);
  if (total >= r.info.world_size) {  // (over it: an add whose answer was lost, sent again)
    s.owed_done = p.step;  // (a failure midway: marked again by the next pass)
    mark_done(*s.store, r.prefix, p.step);
    s.owed_done.reset();
  }
}

// Sends each area's newest committed state not sent yet to the buddy and counts it (once per step
// and rank); true where one was sent (the pass is busy).
bool StateCopies::send_new(Sending& s) {
  Round& r = s.round;
  const auto& info = r.info;
  const int round = info.round, n = areas_.ranks();
  const auto [host, port] = StateLinkClient::split_address(r.buddy);
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  const auto page = sl::page();
  bool busy = false;
  std::vector<unsigned char> head(page);
  for (int i = 0; i < n && wanted(round); ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int fd = areas_.fd(i);
    if (s.pending[u]) {
      // The worker's next save waits until its step is replicated; it writes over it only after
      // its own wait ran out: then it is gone, and the area's newest is sent next.
      if (get_u64(fd, s.pending[u]->at) == s.pending[u]->gen) {
        count_sent(s, u);
        continue;
      }
      s.pending[u].reset();
    }
    const std::uint64_t latest = get_u64(fd, sl::kLatestAt), gen = latest >> 1;
    if (gen == 0 || gen <= s.sent[u]) continue;
    busy = true;
    const std::uint64_t at = page + (latest & 1) * slot_bytes;
    area_io::read(fd, head.data(), page, at);
    const auto h = sl::slot_header(head.data());
    if (h.gen != gen || h.commit != gen || !h.committed_within(slot_bytes)) {  // being written over
      s.sent[u] = gen;
      continue;
    }
    const int rank = info.rank_offset + i;
    StateLinkClient client(host, port, r.key());
    InFlight in_flight(*this, client.fd());  // a new round or the end cuts it short
    const bool kept = client.put(rank, fd, at, page + h.payload(), bytes_per_s_, cancel_, [&] {
      return get_u64(fd, at) == gen;  // the commit word unchanged: the worker never wrote the slot meanwhile
    });
    s.sent[u] = gen;
    if (!kept) {
      spdlog::warn("ddprun: round {}: the buddy node ({}) did not keep rank {}'s state of step {}", round, r.buddy, rank,
                   h.step);
      continue;
    }
    placement_.saw_state();
    s.pending[u] = Sending::Pending{gen, at, h.step, std::chrono::steady_clock::now()};
    count_sent(s, u);
  }
  return busy;
}

// Each state sent becomes the area's replicated one once every rank's buddy holds its step: one
// wait on the oldest step pending (the store answers when it is set), then a check of each.
bool StateCopies::mark_replicated(Sending& s) {
  Round& r = s.round;
  const int round = r.info.round, n = areas_.ranks();
  auto& store = *s.store;
  std::optional<Sending::Pending> oldest;
  for (const auto& p : s.pending) {
    if (p && (!oldest || p->since < oldest->since)) oldest = p;
  }
  if (!oldest) return false;
  try {
    store.wait({r.at(fmt::format("done/{}", oldest->step))}, 200ms);
  } catch (const TimeoutError&) {
    return true;
  }
  for (int i = 0; i < n; ++i) {
    auto& p = s.pending[static_cast<std::size_t>(i)];
    if (!p || !store.check({r.at(fmt::format("done/{}", p->step))})) continue;
    put_u64(areas_.fd(i), sl::kReplicatedAt, p->gen);
    p.reset();
    if (std::exchange(s.unpinned, false)) {
      for (int j = 0; j < n; ++j) put_u64(areas_.fd(j), sl::kCopiesAt, 1);
      spdlog::info("ddprun: round {}: every rank's buddy holds step {}: the saves wait for the copies again", round,
                   oldest->step);
    }
    if (!std::exchange(s.first_done, true)) server_.drop_before(round);  // older rounds' copies: all superseded
  }
  return true;
}

}  // namespace ddprun::agent
