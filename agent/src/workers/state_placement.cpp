#include "workers/state_placement.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <tuple>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "workers/state_area_io.hpp"
#include "workers/state_areas.hpp"
#include "workers/state_link.hpp"

namespace ddprun::agent {
namespace sl = ddprun::state_layout;
namespace {

using namespace std::chrono_literals;

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

// The committed slots of `fd`'s area, as images of round `round`, oldest first.
std::vector<StateImage> read_images(int fd, std::uint64_t slot_bytes, int round) {
  std::vector<StateImage> out;
  const auto page = sl::page();
  std::vector<unsigned char> head(page);
  area_io::read(fd, head.data(), page, 0);
  if (!sl::header(head.data()).magic) return out;
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) {
    const std::uint64_t at = page + k * slot_bytes;
    area_io::read(fd, head.data(), page, at);
    const auto h = sl::slot_header(head.data());
    if (!h.committed_within(slot_bytes)) continue;
    const std::uint64_t bytes = page + h.payload();
    std::shared_ptr<unsigned char[]> data(new unsigned char[bytes]);
    area_io::read(fd, data.get(), bytes, at);
    out.push_back(StateImage{h.gen, h.step, bytes, std::move(data), round});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.gen < b.gen; });
  return out;
}

// Whether the area holds a committed state (its headers only are read).
bool holds_state(int fd, std::uint64_t slot_bytes) {
  const auto page = sl::page();
  std::vector<unsigned char> head(page);
  area_io::read(fd, head.data(), page, 0);
  if (!sl::header(head.data()).magic) return false;
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) {
    area_io::read(fd, head.data(), page, page + k * slot_bytes);
    if (sl::slot_header(head.data()).committed_within(slot_bytes)) return true;
  }
  return false;
}

// Empties the area (no committed slot), its pins let go of.
void clear_area(int fd, std::uint64_t slot_bytes) {
  const auto page = sl::page();
  for (std::uint32_t k = 0; k < sl::kSlots; ++k) area_io::put_u64(fd, page + k * slot_bytes, 0);  // each slot's commit word
  area_io::put_u64(fd, sl::kLatestAt, 0);
  area_io::put_u64(fd, sl::kReplicatedAt, 0);
  area_io::put_u64(fd, sl::kCopiesAt, 0);
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
    area_io::write(fd, img.data.get() + 8, img.bytes - 8, page + k * slot_bytes + 8);
    area_io::write(fd, img.data.get(), 8, page + k * slot_bytes);
    latest = img.gen << 1 | k;
    ++k;
  }
  if (k == 0) return;
  unsigned char head[sl::kHeaderBytes];
  sl::write_header(head, sl::kSlots, slot_bytes, latest);
  area_io::write(fd, head, sizeof head, 0);
}

}  // namespace

StatePlacement::StatePlacement(const StateAreas& areas, StateLinkServer& server, std::string host)
    : areas_(areas), server_(server), host_(std::move(host)), area_rank_(static_cast<std::size_t>(areas.ranks())) {
  // Before any round of several nodes, area i holds the state of rank i (a single node's).
  for (std::size_t i = 0; i < area_rank_.size(); ++i) area_rank_[i] = static_cast<int>(i);
}

std::string StatePlacement::here() const { return fmt::format("{}:{}", host_, server_.port()); }

bool StatePlacement::holds() const {
  // The areas first: settle() keeps an area's state aside before it empties the area, so a state
  // on its way between the two is seen in one or the other.
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  for (int i = 0; i < areas_.ranks(); ++i) {
    if (holds_state(areas_.fd(i), slot_bytes)) return true;
  }
  return !server_.ranks().empty();
}

void StatePlacement::settle(const rounds::RoundInfo& info, const RoundKeys& keys) {
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const std::uint64_t slot_bytes = sl::area_slot_bytes(areas_.bytes_per_rank());
  // An area keeps its state where this node ran the same rank in the round before; else (its
  // rank moved, or this node sat the last round out) the newest holder's is fetched.
  const bool continued = settled_round_ == info.round - 1;
  settled_round_ = -1;  // until every area's state is in place
  // A node that ran the last round and has seen no state in the job (none saved, copied or kept
  // here) has nothing to look for: its restart does not wait for the others' word.
  seen_state_ = seen_state_ || holds();
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
  // Only the members that said they hold state publish, and are waited for (none: nothing to look for).
  if (info.holds_state) publish(info, keys);
  const double kept_s = since();
  if (!need.empty() && info.state_holders > 0 && !wait_all(info, keys)) return;
  const double waited_s = since();
  bool fetched_all = true;
  for (int i : need) fetched_all = fetch(info, keys, i, slot_bytes) && fetched_all;
  if (fetched_all) settled_round_ = info.round;
  if (!need.empty()) {
    spdlog::info("ddprun: round {}: the ranks' state in place in {:.2f} s (kept aside {:.2f} s, the others' "
                 "word {:.2f} s, fetched {:.2f} s)",
                 info.round, since(), kept_s, waited_s - kept_s, since() - waited_s);
  }
}

// Where this node serves copies from, for every rank it holds one of (the newest holder of a rank
// wins the key: a compare-and-set of "round step host:port"); then this node counts itself
// published (the last of the round's holders to count says so for all).
void StatePlacement::publish(const rounds::RoundInfo& info, const RoundKeys& keys) {
  const std::string here = this->here();
  auto& store = keys.store();
  for (int rank : server_.ranks()) {
    const auto imgs = server_.images(rank);
    const Holder mine{imgs.back().round, imgs.back().step, here};
    store.set(keys.at(fmt::format("alt/{}", rank)), mine.text());  // any holder: where the newest fails
    const std::string key = keys.at(fmt::format("at/{}", rank));
    std::string current;
    for (int tries = 0; tries < 8; ++tries) {
      const auto theirs = Holder::parse(current);
      if (theirs && !(theirs->older_than(mine))) break;
      const std::string now = store.compare_set(key, current, mine.text());
      if (now == mine.text()) break;
      current = now;
    }
  }
  if (store.add(keys.at("published"), 1) == info.state_holders) store.set(keys.at("all"), "1");
}

bool StatePlacement::wait_all(const rounds::RoundInfo& info, const RoundKeys& keys) {
  // Every holder publishes as its round begins; bounded, and cut short by the next round or the end.
  const auto until = std::chrono::steady_clock::now() + 30s;
  auto& store = keys.store();
  for (;;) {
    if (!keys.wanted()) return false;
    try {
      store.wait({keys.at("all")}, 500ms);
      return true;
    } catch (const TimeoutError&) {
      if (std::chrono::steady_clock::now() > until) {
        throw Error(fmt::format("not every node of round {} that holds state said within 30 s which ranks' it "
                                "holds (a node lost meanwhile?)",
                                info.round));
      }
    }
  }
}

bool StatePlacement::fetch(const rounds::RoundInfo& info, const RoundKeys& keys, int local_rank, std::uint64_t slot_bytes) {
  const int rank = info.rank_offset + local_rank;
  // The holder of the newest, then any other that said so (where the newest is lost meanwhile).
  std::vector<Holder> holders;
  if (info.state_holders > 0) {  // (none: nobody to ask)
    auto& store = keys.store();
    for (const char* which : {"at", "alt"}) {
      const std::string key = keys.at(fmt::format("{}/{}", which, rank));
      auto h = store.check({key}) ? Holder::parse(store.get(key)) : std::nullopt;
      if (h && (holders.empty() || holders[0].address != h->address)) holders.push_back(*h);
    }
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
      if (holder.address == here()) {
        images = server_.images(rank);
        from = "this node";
      } else {
        const auto [host, port] = StateLinkClient::split_address(holder.address);
        images = StateLinkClient(host, port, keys.key()).get(rank, slot_bytes);
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

}  // namespace ddprun::agent
