#include "workers/state_copies.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <tuple>
#include <optional>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "workers/state_areas.hpp"

namespace ddprun::agent {
namespace sl = ddprun::state_layout;
namespace {

using namespace std::chrono_literals;

void pread_exact(int fd, unsigned char* buf, std::size_t n, std::uint64_t at) {
  if (const int e = pread_full(fd, buf, n, at)) throw Error(fmt::format("reading a state area: {}", std::strerror(e)));
}

void pwrite_exact(int fd, const unsigned char* buf, std::size_t n, std::uint64_t at) {
  if (const int e = pwrite_full(fd, buf, n, at)) throw Error(fmt::format("writing a state area: {}", std::strerror(e)));
}

void put_u64(int fd, std::uint64_t at, std::uint64_t v) {
  unsigned char b[8];
  sl::write_at(b, v);
  pwrite_exact(fd, b, 8, at);
}

std::uint64_t get_u64(int fd, std::uint64_t at) {
  unsigned char b[8];
  pread_exact(fd, b, 8, at);
  return sl::read_at<std::uint64_t>(b);
}

// Every rank's buddy holds `step`: it is marked done. Its count is read no more, nor is an older
// step's mark: an agent counts a rank's newer step only once its older one is done or written
// over, so once every rank counted `step`, no agent waits for an older one. Both are deleted: the
// workers' store holds a few of these keys however long the job runs, not two a step.
void mark_done(rendezvous::TcpStore& store, const std::string& prefix, std::int64_t step) {
  const auto done = [&](std::int64_t s) { return fmt::format("{}done/{}", prefix, s); };
  store.set(done(step), "1");
  store.delete_key(fmt::format("{}step/{}", prefix, step));
  const std::string key = prefix + "done", mine = std::to_string(step);
  std::string current;  // the newest step done before this one ("": none), raised to this one
  for (int tries = 0; tries < 8; ++tries) {
    const auto newest = parse_int(current);
    if (newest && *newest >= step) return;  // a newer step was done first: this mark stays (steps went back)
    const std::string now = store.compare_set(key, current, mine);
    if (now == mine) {
      if (newest) store.delete_key(done(*newest));
      return;
    }
    current = now;
  }
}

// "host:port" split at its last colon (an IPv6 literal keeps its own).
std::pair<std::string, std::uint16_t> address(const std::string& a) {
  const auto colon = a.rfind(':');
  const auto port = colon == std::string::npos ? std::nullopt : parse_int(std::string_view(a).substr(colon + 1), 1, 65535);
  if (!port || colon == 0) throw Error(fmt::format("a malformed state copy address '{}' (host:port expected)", escape_for_log(a)));
  return {a.substr(0, colon), static_cast<std::uint16_t>(*port)};
}

// Who serves a rank's state best: the holder of the newest (round, step), as "round step host:port".
struct Holder {
  int round = 0;
  std::int64_t step = 0;
  std::string address;
  std::string text() const { return fmt::format("{} {} {}", round, step, address); }
  bool older_than(const Holder& o) const { return std::tie(round, step) < std::tie(o.round, o.step); }
  static std::optional<Holder> parse(const std::string& s) {
    Holder h;
    char addr[300];
    long long step = 0;
    if (std::sscanf(s.c_str(), "%d %lld %299s", &h.round, &step, addr) != 3) return std::nullopt;
    h.step = step;
    h.address = addr;
    return h;
  }
};

}  // namespace

struct StateCopies::Round {
  rounds::RoundInfo info;
  std::function<void()> ready;
  std::string prefix, key, buddy;  // the round's keys' prefix, its copy key, the buddy's address
  std::string at(const std::string& what) const { return prefix + what; }
};

StateCopies::StateCopies(const StateAreas& areas, std::string host, std::uint64_t bytes_per_s, std::uint64_t budget,
                         std::string secret, std::string run_id)
    : areas_(areas), host_(std::move(host)), bytes_per_s_(bytes_per_s), secret_(std::move(secret)),
      run_id_(std::move(run_id)), server_(budget),
      area_rank_(static_cast<std::size_t>(areas.ranks())) {
  // Before any round of several nodes, area i holds the state of rank i (a single node's).
  for (std::size_t i = 0; i < area_rank_.size(); ++i) area_rank_[i] = static_cast<int>(i);
}

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

void StateCopies::prepare(const rounds::RoundInfo& info, std::function<void()> ready) {
  if (!thread_.joinable()) {
    server_.start();
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
  sending_ = -1;
  cancel_ = true;
  cut_in_flight();
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

// ---- settling: each area's state put in place for its rank --------------------------------------

namespace {

// The committed slots of `fd`'s area, as images of round `round`, oldest first.
std::vector<StateImage> read_images(int fd, std::uint64_t slot_bytes, int round) {
  std::vector<StateImage> out;
  const auto page = sl::page();
  std::vector<unsigned char> head(page);
  pread_exact(fd, head.data(), page, 0);
  if (!sl::header(head.data()).magic) return out;
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) {
    const std::uint64_t at = page + k * slot_bytes;
    pread_exact(fd, head.data(), page, at);
    const auto h = sl::slot_header(head.data());
    if (!h.committed_within(slot_bytes)) continue;
    const std::uint64_t bytes = page + h.payload();
    std::shared_ptr<unsigned char[]> data(new unsigned char[bytes]);
    pread_exact(fd, data.get(), bytes, at);
    out.push_back(StateImage{h.gen, h.step, bytes, std::move(data), round});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.gen < b.gen; });
  return out;
}

// Whether the area holds a committed state (its headers only are read).
bool holds_state(int fd, std::uint64_t slot_bytes) {
  const auto page = sl::page();
  std::vector<unsigned char> head(page);
  pread_exact(fd, head.data(), page, 0);
  if (!sl::header(head.data()).magic) return false;
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) {
    pread_exact(fd, head.data(), page, page + k * slot_bytes);
    if (sl::slot_header(head.data()).committed_within(slot_bytes)) return true;
  }
  return false;
}

// Empties the area (no committed slot), its pins let go of.
void clear_area(int fd, std::uint64_t slot_bytes) {
  const auto page = sl::page();
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) put_u64(fd, page + k * slot_bytes, 0);  // each slot's commit word
  put_u64(fd, 24, 0);  // latest
  put_u64(fd, sl::kReplicatedAt, 0);
  put_u64(fd, sl::kCopiesAt, 0);
}

// Writes `images` (oldest first, two at most) into the emptied area as its committed slots.
void write_images(int fd, std::uint64_t slot_bytes, const std::vector<StateImage>& images) {
  const auto page = sl::page();
  std::uint64_t latest = 0;
  std::uint32_t k = 0;
  for (const auto& img : images) {
    if (img.bytes > slot_bytes) {
      throw Error(fmt::format("its state of step {} ({} MB) does not fit this node's area ({} MB a slot); give "
                              "this node the --state_memory of the others",
                              img.step, img.bytes >> 20, slot_bytes >> 20));
    }
    // The slot's commit word last: a reader sees the slot whole or not at all.
    pwrite_exact(fd, img.data.get() + 8, img.bytes - 8, page + k * slot_bytes + 8);
    pwrite_exact(fd, img.data.get(), 8, page + k * slot_bytes);
    latest = img.gen << 1 | k;
    ++k;
  }
  if (k == 0) return;
  unsigned char head[sl::kHeaderBytes];
  sl::write_header(head, sl::kSlots, slot_bytes, latest);
  pwrite_exact(fd, head, sizeof head, 0);
}

}  // namespace

void StateCopies::settle(Round& r) {
  const auto& info = r.info;
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  rendezvous::TcpStoreOptions o;
  o.host = info.store_host;
  o.port = info.store_port;
  o.timeout = 10s;
  rendezvous::TcpStore store(o);
  // The round's copy key: derived from the job's secret where it has one (it never crosses the
  // wire), else the first agent's random key in the workers' store (as private as that store).
  r.key = secret_.empty() ? store.compare_set(r.at("key"), "", random_hex(64))
                          : derive_key(secret_, fmt::format("{}/{}", run_id_, info.round));
  server_.set_key(r.key);
  server_.set_round(info.round);
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  for (int i = 0; i < areas_.ranks(); ++i) put_u64(areas_.fd(i), sl::kCopiesAt, 0);  // until the round's copies start
  // However the settling ends (an error included), the round's copies are armed.
  struct Arm {
    StateCopies& self;
    const rounds::RoundInfo& info;
    bool complete = false;  // every area's state in place (else the next round looks again)
    ~Arm() { self.arm(info, complete); }
  } arm{*this, info};
  // An area keeps its state where this node ran the same rank in the round before; else (its
  // rank moved, or this node sat the last round out) the newest holder's is fetched.
  const bool continued = settled_round_ == info.round - 1;
  // A node that ran the last round and has seen no state in the job (none saved, copied or kept
  // here) has nothing to look for: its restart does not wait for the others' word.
  if (!server_.ranks().empty()) seen_state_ = true;
  for (int i = 0; i < areas_.ranks() && !seen_state_; ++i) seen_state_ = holds_state(areas_.fd(i), slot_bytes);
  std::vector<int> need;  // local ranks whose state is elsewhere
  for (int i = 0; i < areas_.ranks(); ++i) {
    const int rank = info.rank_offset + i, had = area_rank_[static_cast<std::size_t>(i)];
    const int fd = areas_.fd(i);
    if (continued && had == rank && holds_state(fd, slot_bytes)) continue;
    // Another rank's state: kept as a copy of it (for the node that has that rank now), then emptied.
    for (auto& img : read_images(fd, slot_bytes, info.round - 1)) {
      const auto step = img.step;
      if (!server_.keep(had, std::move(img))) {
        spdlog::error("ddprun: round {}: rank {}'s in-memory state of step {} is dropped: no room to keep it "
                      "for the node that has that rank now",
                      info.round, had, step);
      }
    }
    clear_area(fd, slot_bytes);
    area_rank_[static_cast<std::size_t>(i)] = rank;
    if (info.round > 0 && (seen_state_ || !continued)) need.push_back(i);  // its state may be elsewhere
  }
  publish(r, store);
  const double kept_s = since();
  if (!need.empty() && !wait_all(r, store)) return;
  const double waited_s = since();
  bool fetched_all = true;
  for (int i : need) fetched_all = fetch(r, store, i, slot_bytes) && fetched_all;
  arm.complete = fetched_all;
  if (!need.empty()) {
    spdlog::info("ddprun: round {}: the ranks' state in place in {:.2f} s (kept aside {:.2f} s, the others' "
                 "word {:.2f} s, fetched {:.2f} s)",
                 info.round, since(), kept_s, waited_s - kept_s, since() - waited_s);
  }
}

// Where this node serves copies from, for every rank it holds one of (the newest holder of a rank
// wins the key: a compare-and-set of "round step host:port"); where its buddy sends to; then this
// node counts itself published (the last to count says so for all).
void StateCopies::publish(Round& r, rendezvous::TcpStore& store) {
  const auto& info = r.info;
  const std::string here = fmt::format("{}:{}", host_, server_.port());
  store.set(r.at(fmt::format("link/{}", info.group_rank)), here);
  for (int rank : server_.ranks()) {
    const auto imgs = server_.images(rank);
    const Holder mine{imgs.back().round, imgs.back().step, here};
    store.set(r.at(fmt::format("alt/{}", rank)), mine.text());  // any holder: where the newest fails
    const std::string key = r.at(fmt::format("at/{}", rank));
    std::string current;
    for (int tries = 0; tries < 8; ++tries) {
      const auto theirs = Holder::parse(current);
      if (theirs && !(theirs->older_than(mine))) break;
      const std::string now = store.compare_set(key, current, mine.text());
      if (now == mine.text()) break;
      current = now;
    }
  }
  if (store.add(r.at("published"), 1) == info.group_world) store.set(r.at("all"), "1");
}

// The state each area holds as settling ends counts as replicated (the copies held, until the
// round's first replicated step, cover it): the round's first save goes on at once, the next
// waits for it, at most the hold limit. `complete`: every area's state in place (else the next
// round looks again).
void StateCopies::arm(const rounds::RoundInfo& info, bool complete) noexcept {
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
  settled_round_ = complete ? info.round : -1;
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
    pread_exact(fd, head.data(), sl::kHeaderBytes, 0);
    const auto latest = sl::header(head.data()).latest;
    pread_exact(fd, head.data(), head.size(), sl::page() + (latest & 1) * slot_bytes);
    const auto h = sl::slot_header(head.data());
    if (h.committed_within(slot_bytes)) node += static_cast<double>(sl::page() + h.payload());
  }
  return 10s + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(bytes_per_s_ ? 3.0 * node / static_cast<double>(bytes_per_s_) : 0.0));
}

bool StateCopies::wait_all(Round& r, rendezvous::TcpStore& store) {
  const auto& info = r.info;
  // Every member publishes as its round begins; bounded, and cut short by the next round or the end.
  const auto until = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    if (!wanted(info.round)) return false;
    try {
      store.wait({r.at("all")}, 500ms);
      return true;
    } catch (const TimeoutError&) {
      if (std::chrono::steady_clock::now() > until) {
        throw Error(fmt::format("not every node of round {} said within 30 s which ranks' state it holds (a node "
                                "lost meanwhile?)",
                                info.round));
      }
    }
  }
}

bool StateCopies::fetch(Round& r, rendezvous::TcpStore& store, int local_rank, std::uint64_t slot_bytes) {
  const auto& info = r.info;
  const int rank = info.rank_offset + local_rank;
  // The holder of the newest, then any other that said so (where the newest is lost meanwhile).
  std::vector<Holder> holders;
  for (const char* which : {"at", "alt"}) {
    const std::string key = r.at(fmt::format("{}/{}", which, rank));
    auto h = store.check({key}) ? Holder::parse(store.get(key)) : std::nullopt;
    if (h && (holders.empty() || holders[0].address != h->address)) holders.push_back(*h);
  }
  if (holders.empty()) {
    spdlog::warn("ddprun: round {}: no node holds rank {}'s in-memory state (its node and the buddy that kept a copy "
                 "were lost together, or it never saved): it starts without it, and ddprun.state.load() returns "
                 "None on every rank; resume from your disk checkpoint",
                 info.round, rank);
    return true;  // nowhere to look again
  }
  std::string failures;
  for (const auto& holder : holders) {
    try {
      std::vector<StateImage> images;
      std::string from = holder.address;
      if (holder.address == fmt::format("{}:{}", host_, server_.port())) {
        images = server_.images(rank);
        from = "this node";
      } else {
        const auto [host, port] = address(holder.address);
        images = StateLinkClient(host, port, r.key).get(rank, slot_bytes);
      }
      if (images.empty()) throw Error("it holds none any more");
      write_images(areas_.fd(local_rank), slot_bytes, images);
      seen_state_ = true;
      spdlog::info("ddprun: round {}: rank {}'s in-memory state (step{} {}) taken from {}", info.round, rank,
                   images.size() > 1 ? "s" : "",
                   images.size() > 1 ? fmt::format("{} and {}", images[0].step, images[1].step)
                                     : std::to_string(images[0].step),
                   from);
      return true;
    } catch (const std::exception& e) {
      failures += fmt::format("{}{}: {}", failures.empty() ? "" : "; ", holder.address, e.what());
    }
  }
  spdlog::warn("ddprun: round {}: rank {}'s in-memory state could not be taken from the nodes that hold it ({}); it "
               "starts without it, and ddprun.state.load() returns None on every rank",
               info.round, rank, failures);
  return false;
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
  std::optional<std::chrono::steady_clock::time_point> failing, held;
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
      held.reset();
    } else if (!held) {
      held = now;
    } else if (!s.unpinned && now - *held > give_up) {
      s.unpin(areas_);
      spdlog::warn("ddprun: round {}: a save has waited {:.0f} s for its step to reach every rank's buddy (does "
                   "every rank save the same steps? is the buddy node out of room?); the saves stop waiting for "
                   "the copies until one does: a node lost meanwhile may lose its ranks' state",
                   round, std::chrono::duration<double>(now - *held).count());
    }
    try {
      if (!s.store) {  // (made again after a failure)
        rendezvous::TcpStoreOptions o;
        o.host = info.store_host;
        o.port = info.store_port;
        o.timeout = 1s;  // its host lost, the next round's settle is not kept waiting long
        s.store = std::make_unique<rendezvous::TcpStore>(o);
      }
      pass(s);
      failing.reset();
    } catch (const std::exception& e) {
      if (!wanted(round)) return;
      s.store.reset();
      if (!failing) {
        failing = now;
        spdlog::warn("ddprun: round {}: copying the workers' state to the buddy node failed ({}); trying again",
                     round, e.what());
      }
      std::this_thread::sleep_for(200ms);
    }
  }
}

void StateCopies::Sending::unpin(const StateAreas& areas) {
  unpinned = true;
  for (int j = 0; j < areas.ranks(); ++j) put_u64(areas.fd(j), sl::kCopiesAt, 0);
}

// One pass: each area's new committed state sent and counted, then a wait for a step pending.
void StateCopies::pass(Sending& s) {
  Round& r = s.round;
  const auto& info = r.info;
  const int round = info.round, n = areas_.ranks();
  auto& store = *s.store;
  const std::string link = r.at(fmt::format("link/{}", (info.group_rank + 1) % info.group_world));
  if (r.buddy.empty()) {  // said by the buddy as its round begins
    try {
      store.wait({link}, 500ms);
      r.buddy = store.get(link);
    } catch (const TimeoutError&) {
      return;
    }
  }
  const auto [host, port] = address(r.buddy);
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  const auto page = sl::page();
  // Counts a state sent (once per step and rank); the count that completes the step marks it done.
  auto count = [&](std::size_t u) {
    const auto& p = *s.pending[u];
    if (s.added[u] == p.step) return;
    const auto total = store.add(r.at(fmt::format("step/{}", p.step)), 1);
    s.added[u] = p.step;
    spdlog::debug("ddprun: round {}: rank {}'s state of step {} (generation {}) sent to {}; {} of {} ranks", round,
                  info.rank_offset + static_cast<int>(u), p.step, p.gen, r.buddy, total, info.world_size);
    if (total == info.world_size) mark_done(store, r.prefix, p.step);
  };
  bool busy = false;
  std::vector<unsigned char> head(page);
  for (int i = 0; i < n && wanted(round); ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int fd = areas_.fd(i);
    if (s.pending[u]) {
      // The worker's next save waits until its step is replicated; it writes over it only after
      // its own wait ran out: then it is gone, and the area's newest is sent next.
      if (get_u64(fd, s.pending[u]->at) == s.pending[u]->gen) {
        count(u);
        continue;
      }
      s.pending[u].reset();
    }
    const std::uint64_t latest = get_u64(fd, sl::kLatestAt), gen = latest >> 1;
    if (gen == 0 || gen <= s.sent[u]) continue;
    busy = true;
    const std::uint64_t at = page + (latest & 1) * slot_bytes;
    pread_exact(fd, head.data(), page, at);
    const auto h = sl::slot_header(head.data());
    if (h.gen != gen || h.commit != gen || !h.committed_within(slot_bytes)) {  // being written over
      s.sent[u] = gen;
      continue;
    }
    const int rank = info.rank_offset + i;
    StateLinkClient client(host, port, r.key);
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
    seen_state_ = true;
    s.pending[u] = Sending::Pending{gen, at, h.step, std::chrono::steady_clock::now()};
    count(u);
  }
  if (busy) return;
  // Each state sent becomes the area's replicated one once every rank's buddy holds its step:
  // one wait on the oldest step pending (the store answers when it is set), then a check of each.
  std::optional<Sending::Pending> oldest;
  for (const auto& p : s.pending) {
    if (p && (!oldest || p->since < oldest->since)) oldest = p;
  }
  if (!oldest) {
    std::this_thread::sleep_for(5ms);
    return;
  }
  try {
    store.wait({r.at(fmt::format("done/{}", oldest->step))}, 200ms);
  } catch (const TimeoutError&) {
    return;
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
}

}  // namespace ddprun::agent
