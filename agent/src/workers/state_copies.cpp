#include "workers/state_copies.hpp"

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
#include "workers/state_areas.hpp"

namespace ddprun::agent {
namespace sl = ddprun::state_layout;
namespace {

using namespace std::chrono_literals;

void pread_exact(int fd, unsigned char* buf, std::size_t n, std::uint64_t at) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, buf + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error(fmt::format("reading a state area: {}", std::strerror(r < 0 ? errno : EIO)));
    done += static_cast<std::size_t>(r);
  }
}

void pwrite_exact(int fd, const unsigned char* buf, std::size_t n, std::uint64_t at) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pwrite(fd, buf + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(fmt::format("writing a state area: {}", std::strerror(errno)));
    done += static_cast<std::size_t>(r);
  }
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

// "host:port" split at its last colon (an IPv6 literal keeps its own).
std::pair<std::string, std::uint16_t> address(const std::string& a) {
  const auto colon = a.rfind(':');
  if (colon == std::string::npos) throw Error(fmt::format("a malformed state copy address '{}'", escape_for_log(a)));
  return {a.substr(0, colon), static_cast<std::uint16_t>(std::stoi(a.substr(colon + 1)))};
}

}  // namespace

struct StateCopies::Round {
  rounds::RoundInfo info;
  std::function<void()> ready;
  std::string prefix, key, buddy;  // the round's keys' prefix, its copy key, the buddy's address
  std::string at(const std::string& what) const { return prefix + what; }
};

StateCopies::StateCopies(const StateAreas& areas, std::string host, std::uint64_t bytes_per_s, std::uint64_t budget)
    : areas_(areas), host_(std::move(host)), bytes_per_s_(bytes_per_s), server_(budget),
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
  }
  wake_.notify_all();
}

void StateCopies::stop_sending() { sending_ = -1; }

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
    }
    try {
      settle(*r);
    } catch (const std::exception& e) {
      spdlog::warn("ddprun: round {}: the workers' in-memory state was not put in place for their ranks ({}); "
                   "a rank whose state was elsewhere starts without it",
                   r->info.round, e.what());
    }
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

// Empties the area (no committed slot), its pins let go of.
void clear_area(int fd, std::uint64_t slot_bytes) {
  const auto page = sl::page();
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) put_u64(fd, page + k * slot_bytes, 0);  // each slot's commit word
  put_u64(fd, 24, 0);  // latest
  put_u64(fd, sl::kReplicatedAt, 0);
  put_u64(fd, sl::kSendingAt, 0);
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
  rendezvous::TcpStoreOptions o;
  o.host = info.store_host;
  o.port = info.store_port;
  o.timeout = 10s;
  rendezvous::TcpStore store(o);
  // The round's copy key: the first agent's, the same for all (compare_set sets it where absent).
  r.key = store.compare_set(r.at("key"), "", random_hex(64));
  server_.set_key(r.key);
  server_.set_round(info.round);
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  std::vector<int> need;  // local ranks whose state is elsewhere
  for (int i = 0; i < areas_.ranks(); ++i) {
    const int rank = info.rank_offset + i, had = area_rank_[static_cast<std::size_t>(i)];
    const int fd = areas_.fd(i);
    auto images = read_images(fd, slot_bytes, info.round - 1);
    if (had == rank && !images.empty()) continue;
    // Another rank's state: kept as a copy of it (for the node that has that rank now), then emptied.
    for (auto& img : images) server_.keep(had, std::move(img));
    clear_area(fd, slot_bytes);
    if (info.round > 0) need.push_back(i);  // a rank of a running job: its state may be elsewhere
  }
  // Where this node serves copies from, for every rank it holds one of; where its buddy sends to.
  const std::string here = fmt::format("{}:{}", host_, server_.port());
  std::vector<std::string> keys{r.at(fmt::format("link/{}", info.group_rank))}, values{here};
  for (int rank : server_.ranks()) {
    keys.push_back(r.at(fmt::format("at/{}", rank)));
    values.push_back(here);
  }
  store.multi_set(keys, values);
  if (store.add(r.at("published"), 1) == info.group_world) store.set(r.at("all"), "1");
  if (!need.empty()) {
    // Every member publishes as its round begins; bounded, and cut short when the agent ends.
    const auto until = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      if (stop_.load()) return;
      try {
        store.wait({r.at("all")}, 500ms);
        break;
      } catch (const TimeoutError&) {
        if (std::chrono::steady_clock::now() > until) {
          throw Error(fmt::format("not every node of round {} said where it keeps copies within 30 s", info.round));
        }
      }
    }
    for (int i : need) {
      const int rank = info.rank_offset + i;
      try {
        auto images = server_.images(rank);
        std::string from = "this node";
        if (images.empty() && store.check({r.at(fmt::format("at/{}", rank))})) {
          from = store.get(r.at(fmt::format("at/{}", rank)));
          const auto [host, port] = address(from);
          images = StateLinkClient(host, port, r.key).get(rank);
        }
        if (images.empty()) {
          if (info.round > 0) {
            spdlog::warn("ddprun: round {}: no node holds rank {}'s in-memory state (its node and the buddy that "
                         "kept a copy were lost together, or it never saved): it starts without it, and "
                         "ddprun.state.load() returns None on every rank; resume from your disk checkpoint",
                         info.round, rank);
          }
          continue;
        }
        write_images(areas_.fd(i), slot_bytes, images);
        spdlog::info("ddprun: round {}: rank {}'s in-memory state (step{} {}) taken from {}", info.round, rank,
                     images.size() > 1 ? "s" : "",
                     images.size() > 1 ? fmt::format("{} and {}", images[0].step, images[1].step)
                                       : std::to_string(images[0].step),
                     from);
      } catch (const std::exception& e) {
        spdlog::warn("ddprun: round {}: rank {}'s in-memory state could not be taken from the node that holds it "
                     "({}); it starts without it",
                     info.round, rank, e.what());
      }
    }
  }
  for (int i = 0; i < areas_.ranks(); ++i) {
    area_rank_[static_cast<std::size_t>(i)] = info.rank_offset + i;
    put_u64(areas_.fd(i), sl::kReplicatedAt, 0);  // no pin crosses rounds: the held copies cover them
    put_u64(areas_.fd(i), sl::kSendingAt, 0);
  }
}

// ---- sending: each new committed state to the buddy ---------------------------------------------

void StateCopies::send(Round& r) {
  const auto& info = r.info;
  const int round = info.round;
  rendezvous::TcpStoreOptions o;
  o.host = info.store_host;
  o.port = info.store_port;
  o.timeout = 10s;
  rendezvous::TcpStore store(o);
  const std::string link = r.at(fmt::format("link/{}", (info.group_rank + 1) % info.group_world));
  while (r.buddy.empty()) {
    if (!wanted(round)) return;
    try {
      store.wait({link}, 500ms);
      r.buddy = store.get(link);
    } catch (const TimeoutError&) {
    }
  }
  const auto [host, port] = address(r.buddy);
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  const auto page = sl::page();
  const int n = areas_.ranks();
  struct Pending {
    std::uint64_t gen = 0;
    std::int64_t step = 0;
    std::chrono::steady_clock::time_point since;
  };
  // Every rank's buddy should hold a step within a few of its copies' times; where one does not
  // (a rank that saves steps the others do not, as "rank 0 saves"), the job has no common step
  // to pin, and copies go on unpinned: the saves never wait on them again this round.
  const auto give_up = std::max<std::chrono::steady_clock::duration>(
      10s, std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(
               bytes_per_s_ ? 3.0 * static_cast<double>(areas_.bytes_per_rank()) / static_cast<double>(bytes_per_s_) : 0)));
  bool unpinned = false;
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(n), 0);
  std::vector<std::optional<Pending>> pending(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) sent[static_cast<std::size_t>(i)] = get_u64(areas_.fd(i), 24) >> 1;
  bool first_done = false;
  std::atomic<bool> cancel{false};
  std::vector<unsigned char> head(page);
  while (wanted(round)) {
    bool busy = false;
    for (int i = 0; i < n && wanted(round); ++i) {
      const auto u = static_cast<std::size_t>(i);
      const int fd = areas_.fd(i);
      const std::uint64_t latest = get_u64(fd, 24), gen = latest >> 1;
      if (pending[u]) {
        if (gen != pending[u]->gen) {  // the worker saved over the pinned state (after its wait): move on
          pending[u].reset();
          put_u64(fd, sl::kSendingAt, 0);
        }
        continue;
      }
      if (gen == 0 || gen <= sent[u]) continue;
      busy = true;
      const std::uint64_t at = page + (latest & 1) * slot_bytes;
      put_u64(fd, sl::kSendingAt, gen);  // the worker's saves leave it alone from here
      pread_exact(fd, head.data(), page, at);
      const auto h = sl::slot_header(head.data());
      sent[u] = gen;
      if (h.gen != gen || !h.committed_within(slot_bytes)) {  // being written over: the next one
        put_u64(fd, sl::kSendingAt, 0);
        continue;
      }
      const int rank = info.rank_offset + i;
      const bool kept = StateLinkClient(host, port, r.key).put(rank, fd, at, page + h.payload(), bytes_per_s_, cancel, [&] {
        return get_u64(fd, at) == gen;  // the commit word unchanged: the worker never wrote the slot meanwhile
      });
      if (!kept) {
        put_u64(fd, sl::kSendingAt, 0);
        spdlog::warn("ddprun: round {}: the buddy node ({}) did not keep rank {}'s state of step {}", round, r.buddy,
                     rank, h.step);
        continue;
      }
      if (unpinned) {
        put_u64(fd, sl::kSendingAt, 0);
        continue;
      }
      pending[u] = Pending{gen, h.step, std::chrono::steady_clock::now()};
      const std::string count = r.at(fmt::format("step/{}", h.step));
      const auto added = store.add(count, 1);
      spdlog::debug("ddprun: round {}: rank {}'s state of step {} (generation {}, {} bytes) sent to {}; {} of {} ranks",
                    round, rank, h.step, gen, page + h.payload(), r.buddy, added, info.world_size);
      if (added == info.world_size) {
        store.set(r.at(fmt::format("done/{}", h.step)), "1");
        store.delete_key(count);
      }
    }
    // Each state sent becomes the area's replicated one once every rank's buddy holds its step.
    std::optional<std::string> waiting;
    for (int i = 0; i < n; ++i) {
      auto& p = pending[static_cast<std::size_t>(i)];
      if (!p) continue;
      const std::string done = r.at(fmt::format("done/{}", p->step));
      if (!store.check({done})) {
        if (std::chrono::steady_clock::now() - p->since < give_up) {
          waiting = done;
          continue;
        }
        spdlog::warn("ddprun: round {}: not every rank's buddy holds step {} after {:.0f} s (does every rank save "
                     "the same steps?); the copies go on, but the saves no longer wait for them: a node lost now "
                     "may lose its ranks' state",
                     round, p->step, std::chrono::duration<double>(give_up).count());
        unpinned = true;
        for (int j = 0; j < n; ++j) {
          put_u64(areas_.fd(j), sl::kSendingAt, 0);
          put_u64(areas_.fd(j), sl::kReplicatedAt, 0);
          pending[static_cast<std::size_t>(j)].reset();
        }
        break;
      }
      put_u64(areas_.fd(i), sl::kReplicatedAt, p->gen);
      put_u64(areas_.fd(i), sl::kSendingAt, 0);
      p.reset();
      if (!std::exchange(first_done, true)) server_.drop_before(round);  // older rounds' copies: all superseded
    }
    if (busy) continue;
    if (waiting) {
      try {
        store.wait({*waiting}, 50ms);
      } catch (const TimeoutError&) {
      }
    } else {
      std::this_thread::sleep_for(5ms);
    }
  }
}

}  // namespace ddprun::agent
