#include "ddprun/runtime/memory_state.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <zlib.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "host_gather.hpp"

// The area's layout: ddprun/common/state_layout.hpp. A native trainer's skeleton: "DDPRUNN1",
// u32 buffers, then each buffer's u32 name length, its name, u64 offset in the data, u64 bytes.
// With replicated buffers shared out, "DDPRUNN2": each buffer's name, then u8 1 where it is
// replicated (its offset is then in their space), u64 offset, u64 bytes; after the buffers u32
// world, u32 rank, u64 the space's bytes, u64 where this rank's range of it is in the data.
// (Python's is a pickle: each side refuses the other's.)
namespace ddprun::runtime {
namespace memory_state_layout {

using namespace ddprun::state_layout;
constexpr char kNativeMagic[8] = {'D', 'D', 'P', 'R', 'U', 'N', 'N', '1'};
constexpr char kSharedMagic[8] = {'D', 'D', 'P', 'R', 'U', 'N', 'N', '2'};

// [lo, hi) of each rank: `total` bytes cut into `world` ranges at 64-byte bounds (Python's _ranges).
std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges(std::uint64_t total, int world) {
  std::vector<std::uint64_t> cuts;
  for (int r = 0; r < world; ++r) {
    const auto w = static_cast<std::uint64_t>(world), k = static_cast<std::uint64_t>(r);
    cuts.push_back(std::min(total, static_cast<std::uint64_t>((static_cast<unsigned __int128>(total) * k / w) / 64 * 64)));
  }
  cuts.push_back(total);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (int r = 0; r < world; ++r) out.emplace_back(cuts[static_cast<std::size_t>(r)], cuts[static_cast<std::size_t>(r) + 1]);
  return out;
}

// The variable `name` as an integer in [0, 2^30), else `fallback` (unset or not such a number).
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  const auto n = v ? parse_int(v, 0, (1 << 30) - 1) : std::nullopt;
  return n ? static_cast<int>(*n) : fallback;
}
constexpr std::uint64_t kChunk = 64ull << 20;

// zlib's CRC-32 (as Python's zlib.crc32), over sizes beyond its uInt.
std::uint32_t checksum(const unsigned char* p, std::size_t n) {
  uLong c = ::crc32(0L, Z_NULL, 0);
  for (std::size_t done = 0; done < n;) {
    const auto part = static_cast<uInt>(std::min<std::size_t>(n - done, 1u << 30));
    c = ::crc32(c, p + done, part);
    done += part;
  }
  return static_cast<std::uint32_t>(c);
}

void write_slot_header(unsigned char* p, const SlotHeader& h) {
  write_at(p + 8, h.gen);
  write_at(p + 16, h.step);
  write_at(p + 24, h.skel);
  write_at(p + 32, h.data);
  write_at(p + 40, h.chunk);
  write_at(p + 48, h.chunks);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the commit word last
  write_at(p, h.commit);
}

// 64 MiB, or more where the payload would need more chunks than a slot header holds.
std::uint64_t chunk_bytes(std::uint64_t payload) {
  const std::uint64_t least = (payload + max_chunks() - 1) / max_chunks();
  return std::max<std::uint64_t>(kChunk, (least + page() - 1) / page() * page());
}

// Why a save goes on over `held` while something still holds it back, and what that costs (that
// persist fails; a node lost now may lose its ranks' state with it); empty once nothing does.
std::string pin_message(const unsigned char* map, const SlotHeader& held) {
  const bool persist = held.commit && pinned_generation(map) == held.gen;
  const bool copies = copies_hold(map);
  if (!persist && !copies) return {};
  std::string why, cost;
  auto add = [](std::string& to, const char* sep, const std::string& part) { to += (to.empty() ? "" : sep) + part; };
  if (persist) add(why, " and ", "the agent has not copied the state asked to persist");
  if (copies) add(why, " and ", "this rank's last save has not reached every rank's buddy node");
  if (persist) add(cost, "; ", "that persist fails");
  if (copies) add(cost, "; ", "if a node is lost now, its ranks' state may be lost with it");
  const std::string over = held.commit ? " of step " + std::to_string(held.step) : "";
  return "ddprun state: " + why + " in time; saving over the state" + over + " (" + cost + ")";
}

// Before a save writes the slot that holds `held`: while something holds the save back, until
// it lets go: a persist request for that state until the agent has copied it (at memory speed),
// the agent's copies until the area's newest state has reached every rank's buddy. The area
// keeps two committed states throughout. After a minute the save goes on, and says what that
// costs.
void wait_unpinned(const unsigned char* map, const SlotHeader& held) {
  const std::uint64_t gen = held.commit ? held.gen : 0;
  if (!pinned(map, gen)) return;
  // The copies' hold lasts as long as the agent's own bound (a node's state at its pace), at least a minute.
  const auto limit = copies_hold(map) ? std::max<std::uint64_t>(60, read_at<std::uint64_t>(map + kHoldLimitAt)) : 60;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(limit);
  while (pinned(map, gen)) {
    if (std::chrono::steady_clock::now() > end) {
      const std::string message = pin_message(map, held);
      if (!message.empty()) std::fprintf(stderr, "%s\n", message.c_str());
      return;
    }
    ::usleep(2000);
  }
}

}  // namespace memory_state_layout

using namespace memory_state_layout;

MemoryState::MemoryState() {
  const char* fd_text = std::getenv("DDPRUN_STATE_FD");
  const char* size_text = std::getenv("DDPRUN_STATE_BYTES");
  if (!fd_text || !*fd_text) return;
  // A process that inherited the variables but not the descriptor (a subprocess, a nested
  // launcher) must not write into whatever file now has that number: it says so, once, and
  // goes on without a state, as ddprun.state does.
  auto refuse = [&](const std::string& why) {
    std::fprintf(stderr, "ddprun state: DDPRUN_STATE_FD=%s is not this process's state area (%s); no in-memory state\n",
                 fd_text, why.c_str());
  };
  char* end = nullptr;
  const long fd = std::strtol(fd_text, &end, 10);
  const unsigned long long size = size_text ? std::strtoull(size_text, nullptr, 10) : 0;
  char link[256] = {};
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = *end == '\0' ? ::readlink(proc.c_str(), link, sizeof(link) - 1) : -1;
  if (n <= 0 || std::string(link, static_cast<std::size_t>(n)).rfind("/memfd:ddprun-state-", 0) != 0) {
    refuse("not ddprun's memfd");
    return;
  }
  struct stat st {};
  if (::fstat(static_cast<int>(fd), &st) != 0 || static_cast<unsigned long long>(st.st_size) != size ||
      size < 4 * page()) {
    refuse(std::string("its size is not DDPRUN_STATE_BYTES=") + (size_text ? size_text : ""));
    return;
  }
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(fd), 0);
  if (m == MAP_FAILED) {
    refuse(std::string("mmap: ") + std::strerror(errno));
    return;
  }
  map_ = static_cast<unsigned char*>(m);
  size_ = size;
  slot_bytes_ = area_slot_bytes(size);
}

MemoryState::~MemoryState() {
  wait();
  if (map_) ::munmap(map_, size_);
}

std::size_t MemoryState::capacity() const { return map_ ? slot_bytes_ - page() : 0; }

namespace memory_state_layout {

// (generation, step, slot) of the committed slots, newest first.
// An area has kSlots slots, a persisted file one.
std::vector<std::tuple<std::uint64_t, std::int64_t, int>> committed(const unsigned char* map, std::size_t slot_bytes,
                                                                    std::uint32_t slots = kSlots) {
  std::vector<std::tuple<std::uint64_t, std::int64_t, int>> out;
  const Header head = map ? header(map) : Header{};
  if (!head.magic || head.version != kVersion || head.slots != slots || head.slot_bytes != slot_bytes) return out;
  for (int i = 0; i < static_cast<int>(slots); ++i) {
    const auto h = slot_header(map + page() + static_cast<std::size_t>(i) * slot_bytes);
    if (!h.committed_within(slot_bytes)) continue;
    out.emplace_back(h.gen, h.step, i);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

}  // namespace memory_state_layout

std::vector<std::int64_t> MemoryState::steps() const {
  std::vector<std::int64_t> out;
  for (const auto& [gen, step, slot] : committed(map_, slot_bytes_)) out.push_back(step);
  return out;
}

void MemoryState::save(std::int64_t step, const std::vector<StateBuffer>& buffers) {
  save_async(step, buffers);
  wait();
}

void MemoryState::wait() const {
  if (copying_.joinable()) copying_.join();
}

// A save's layout over `buffers`: the skeleton (the format above) and the pieces this rank copies
// into the slot's data, `data` bytes in all. Replicated buffers are shared out among the ranks of
// the job (RANK of WORLD_SIZE, as ddprun sets them), laid out one after the other in a space of
// their own, this rank's range of it after its own buffers.
struct MemoryState::Layout {
  struct Piece {  // bytes a save copies: from `from`, to `at` in the slot's data
    const unsigned char* from;
    std::uint64_t at, bytes;
  };
  std::string skeleton;
  std::vector<Piece> pieces;
  std::uint64_t data = 0;

  explicit Layout(const std::vector<StateBuffer>& buffers) {
    const int world = env_int("WORLD_SIZE", 1), rank = env_int("RANK", -1);
    const bool shared = world > 1 && rank >= 0 && rank < world &&
                        std::any_of(buffers.begin(), buffers.end(), [](const StateBuffer& b) { return b.replicated; });
    skeleton.assign(shared ? kSharedMagic : kNativeMagic, 8);
    put(static_cast<std::uint32_t>(buffers.size()));
    std::uint64_t space = 0;
    std::vector<std::uint64_t> in_space(buffers.size(), ~0ull);
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const auto& b = buffers[i];
      const bool rep = shared && b.replicated;
      put(static_cast<std::uint32_t>(b.name.size()));
      skeleton += b.name;
      if (shared) put(static_cast<std::uint8_t>(rep ? 1 : 0));
      std::uint64_t& end = rep ? space : data;
      put(end);
      put(static_cast<std::uint64_t>(b.bytes));
      if (rep) in_space[i] = end;
      else pieces.push_back(Piece{static_cast<const unsigned char*>(b.data), end, b.bytes});
      end = align(end + b.bytes);
    }
    if (!shared) return;
    const auto [lo, hi] = ranges(space, world)[static_cast<std::size_t>(rank)];
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (in_space[i] == ~0ull) continue;
      const std::uint64_t a = std::max(lo, in_space[i]), b = std::min(hi, in_space[i] + buffers[i].bytes);
      if (a < b) pieces.push_back(Piece{static_cast<const unsigned char*>(buffers[i].data) + (a - in_space[i]), data + a - lo, b - a});
    }
    put(static_cast<std::uint32_t>(world));
    put(static_cast<std::uint32_t>(rank));
    put(space);
    put(data);
    data = align(data + hi - lo);
  }
  std::size_t bytes() const { return align(skeleton.size()) + data; }  // what the slot must hold

 private:
  template <typename T>
  void put(T v) { skeleton.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
};

void MemoryState::save_async(std::int64_t step, const std::vector<StateBuffer>& buffers) {
  if (!map_) return;
  if (step < 0) {
    throw Error("ddprun state: step " + std::to_string(step) +
                " is negative; save the job's global step, counted from 0 (the previous state is kept)");
  }
  wait();  // the last save's thread may still write the slot this one picks
  Layout layout(buffers);
  const std::size_t needed = layout.bytes();
  if (needed > capacity()) {
    throw Error("ddprun state: the state of step " + std::to_string(step) + " needs " + std::to_string(needed) +
                " bytes but a slot holds " + std::to_string(capacity()) +
                " (half this rank's share of --state_memory, two slots); raise ddprun's --state_memory");
  }
  const auto held = committed(map_, slot_bytes_);
  const int slot = held.empty() ? 0 : 1 - std::get<2>(held.front());
  // Never a generation used before: a persist request may name one whose save never ended, and
  // the header's latest keeps the newest ever committed (a load drops newer states: drop_newer).
  const std::uint64_t gen = std::max({held.empty() ? std::uint64_t{0} : std::get<0>(held.front()),
                                      read_at<std::uint64_t>(map_ + kRequestAt + 8), header(map_).latest >> 1}) +
                            1;
  copying_ = start_thread("the thread of a MemoryState save", [this, step, slot, gen, layout = std::move(layout)] {
    write_slot(step, slot, gen, layout);
  });
  last_gen_ = gen;  // (only once its copy runs: a persist names it)
  last_bytes_ = needed;
}

// The save's copy: the slot written, its CRC-32s, then its commit word and the header's latest.
void MemoryState::write_slot(std::int64_t step, int slot, std::uint64_t gen, const Layout& layout) {
  const std::string& skeleton = layout.skeleton;
  unsigned char* base = map_ + page() + static_cast<std::size_t>(slot) * slot_bytes_;
  wait_unpinned(map_, slot_header(base));
  write_slot_header(base, SlotHeader{});  // uncommitted from here on
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before any byte of the payload
  unsigned char* payload = base + page();
  std::memcpy(payload, skeleton.data(), skeleton.size());
  unsigned char* at = payload + align(skeleton.size());
  for (const auto& p : layout.pieces) {
    if (p.bytes) std::memcpy(at + p.at, p.from, p.bytes);
  }
  SlotHeader h;
  h.gen = gen;
  h.step = step;
  h.skel = skeleton.size();
  h.data = layout.data;
  const std::uint64_t total = layout.bytes();
  h.chunk = chunk_bytes(total);
  for (std::uint64_t i = 0; i < total; i += h.chunk, ++h.chunks) {
    write_at(base + kSlotHeaderBytes + 4 * h.chunks, checksum(payload + i, std::min<std::uint64_t>(h.chunk, total - i)));
  }
  h.commit = gen;
  write_slot_header(base, h);  // its fields, then the commit word, last
  std::atomic_thread_fence(std::memory_order_seq_cst);
  write_header(map_, kSlots, slot_bytes_, gen << 1 | static_cast<std::uint64_t>(slot));
}

namespace {

// The state of `step` in the area or file mapped at `map`, checked against its CRC-32s.
std::optional<MemoryState::Loaded> load_from(const unsigned char* map, std::size_t slot_bytes, std::uint32_t slots,
                                             std::int64_t step, const std::string& where, std::int64_t course = -1) {
  for (const auto& [gen, held, slot] : committed(map, slot_bytes, slots)) {
    if (held != step || (course >= 0 && static_cast<std::int64_t>(gen >> kCourseShift) != course)) continue;
    const unsigned char* base = map + page() + static_cast<std::size_t>(slot) * slot_bytes;
    const auto h = slot_header(base);
    const unsigned char* payload = base + page();
    const std::uint64_t total = align(h.skel) + h.data;
    std::uint32_t n = 0;
    for (std::uint64_t i = 0; i < total; i += h.chunk, ++n) {
      if (n >= h.chunks || checksum(payload + i, std::min<std::uint64_t>(h.chunk, total - i)) !=
                               read_at<std::uint32_t>(base + kSlotHeaderBytes + 4 * n)) {
        throw Error("ddprun state: the state of step " + std::to_string(step) +
                    " fails its CRC-32 check (" + where + "); not loading it");
      }
    }
    const bool shared = h.skel >= 12 && std::memcmp(payload, kSharedMagic, 8) == 0;
    if (h.skel < 12 || (!shared && std::memcmp(payload, kNativeMagic, 8) != 0)) {
      throw Error("ddprun state: the state of step " + std::to_string(step) +
                  " was saved by Python's ddprun.state, not by a native trainer");
    }
    const Error malformed("ddprun state: a malformed native skeleton");
    MemoryState::Loaded out;
    out.step = step;
    const unsigned char* p = payload + 8;
    const unsigned char* skel_end = payload + h.skel;
    const auto count = read_at<std::uint32_t>(p);
    p += 4;
    const unsigned char* data = payload + align(h.skel);
    MemoryState::Loaded::Shared space;
    for (std::uint32_t i = 0; i < count; ++i) {
      if (skel_end - p < 4) throw malformed;
      const auto len = read_at<std::uint32_t>(p);
      const std::size_t flag = shared ? 1 : 0;
      if (static_cast<std::uint64_t>(skel_end - p) < 4ull + len + flag + 16) throw malformed;
      std::string name(reinterpret_cast<const char*>(p + 4), len);
      p += 4 + len;
      const bool rep = shared && *p != 0;
      p += flag;
      const auto off = read_at<std::uint64_t>(p), bytes = read_at<std::uint64_t>(p + 8);
      p += 16;
      if (rep) {
        space.buffers.emplace_back(std::move(name), off, bytes);
        continue;
      }
      if (off > h.data || bytes > h.data - off) throw malformed;
      out.buffers[name].assign(data + off, data + off + bytes);
    }
    if (shared) {
      if (skel_end - p < 24) throw malformed;
      const auto world = read_at<std::uint32_t>(p), rank = read_at<std::uint32_t>(p + 4);
      space.bytes = read_at<std::uint64_t>(p + 8);
      const auto share_at = read_at<std::uint64_t>(p + 16);
      // (a world of a million ranks at most: its ranges are made before the group is compared)
      if (world < 1 || world > (1u << 20) || rank >= world || space.bytes % 64 || share_at % 64) throw malformed;
      space.world = static_cast<int>(world);
      space.rank = static_cast<int>(rank);
      const auto [lo, hi] = ranges(space.bytes, space.world)[static_cast<std::size_t>(space.rank)];
      for (const auto& [n, off, bytes] : space.buffers) {
        if (off > space.bytes || bytes > space.bytes - off) throw malformed;
      }
      if (share_at > h.data || hi - lo > h.data - share_at) throw malformed;
      space.mine.assign(data + share_at, data + share_at + (hi - lo));
      out.shared = std::move(space);
    }
    return out;
  }
  return std::nullopt;
}

// A save's course (kCourseShift, Python's _COURSE_SHIFT): a state a later round abandoned (a
// buddy may still hold it) is never taken for the state of its step made since.
// (step, course) of the newest state every rank of `group` holds, of this rank's committed
// (generation, step, slot), newest first; step -1: none.
std::pair<std::int64_t, std::int64_t> agree(ProcessGroup& group,
                                            const std::vector<std::tuple<std::uint64_t, std::int64_t, int>>& held) {
  std::vector<std::int64_t> mine(4, -1);  // each rank's two newest (step, course), gathered
  for (std::size_t i = 0; i < held.size() && i < 2; ++i) {
    mine[2 * i] = std::get<1>(held[i]);
    mine[2 * i + 1] = static_cast<std::int64_t>(std::get<0>(held[i]) >> kCourseShift);
  }
  const auto world = static_cast<std::size_t>(group.size());
  const auto every = all_gather_on_host(group, mine);
  // Every rank decides over the same gathered states, so all agree.
  std::pair<std::int64_t, std::int64_t> agreed{-1, -1};
  for (std::size_t k = 0; k < 2; ++k) {
    const std::pair<std::int64_t, std::int64_t> s{every[2 * k], every[2 * k + 1]};  // rank 0's
    if (s.first < 0 || s <= agreed) continue;
    bool all = true;
    for (std::size_t r = 1; r < world && all; ++r) {
      all = (every[4 * r] == s.first && every[4 * r + 1] == s.second) ||
            (every[4 * r + 2] == s.first && every[4 * r + 3] == s.second);
    }
    if (all) agreed = s;
  }
  return agreed;
}

// A file persist() wrote, mapped read-only; empty where there is none. A FIFO is never waited on.
class StateFile {
 public:
  explicit StateFile(const std::string& path) {
    const int fd = open_regular(path, O_RDONLY);
    if (fd < 0) {
      if (errno == ENOENT) return;
      throw Error("ddprun state: cannot open " + path + ": " +
                  (errno == EINVAL ? "it is not a regular file (a directory, a FIFO, a device)" : std::strerror(errno)));
    }
    struct stat st {};
    unsigned char head[kHeaderBytes] = {};
    const bool read = ::fstat(fd, &st) == 0 && ::pread(fd, head, sizeof(head), 0) == static_cast<ssize_t>(sizeof(head));
    const Header h = header(head);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (!read || !h.magic || h.version != kVersion || h.slots != 1 || h.slot_bytes < 2 * page() ||
        h.slot_bytes > size - std::min<std::uint64_t>(size, page())) {
      ::close(fd);
      throw Error("ddprun state: " + path + " is not a state file that persist() wrote");
    }
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw Error("ddprun state: cannot map " + path + ": " + std::strerror(errno));
    map_ = static_cast<unsigned char*>(m);
    size_ = size;
    slot_bytes_ = h.slot_bytes;
  }
  ~StateFile() {
    if (map_) ::munmap(map_, size_);
  }
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  const unsigned char* map() const { return map_; }
  std::size_t slot_bytes() const { return slot_bytes_; }

 private:
  unsigned char* map_ = nullptr;
  std::size_t size_ = 0, slot_bytes_ = 0;
};

}  // namespace

std::optional<MemoryState::Loaded> MemoryState::load_step(std::int64_t step) const {
  wait();  // the last save's copy may be writing the slot that holds `step`
  return load_from(map_, slot_bytes_, kSlots, step, "memory written outside MemoryState?");
}

// `load` on every rank of `group`: its result, or, where it failed on any rank, nullopt on every
// rank after saying why, so that none goes on to a collective the others never join, and none
// restarts into the same failure.
template <class Load>
std::optional<MemoryState::Loaded> load_on_all(ProcessGroup& group, Load load) {
  std::optional<MemoryState::Loaded> out;
  std::string error;
  try {
    out = load();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto failed = all_gather_on_host(group, std::vector<std::int64_t>{error.empty() ? 0 : 1});
  const auto first = std::find(failed.begin(), failed.end(), 1);
  if (first == failed.end()) return out;
  std::fprintf(stderr, "%s; starting without this state\n",
               error.empty() ? ("ddprun state: rank " + std::to_string(first - failed.begin()) +
                                " could not load the agreed state (its error says why)").c_str()
                             : error.c_str());
  return std::nullopt;
}

namespace {

// The replicated buffers of `out` (every rank's load succeeded) gathered from every rank's range
// of their space, a broadcast from each; nullopt on every rank, said, where the ranks' states
// were not shared out alike.
std::optional<MemoryState::Loaded> gather(ProcessGroup& group, std::optional<MemoryState::Loaded> out) {
  std::int64_t bytes = -1, layout = 0, ready = 1;  // bytes -1: nothing shared out
  std::vector<unsigned char> space;
  struct Buffer {  // one buffer of the group's memory, the largest range's size, for every broadcast
    ProcessGroup& group;
    void* p = nullptr;
    ~Buffer() {
      if (p) group.deallocate(p);
    }
  } buf{group};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> cut;
  if (out && out->shared) {
    auto& shared = *out->shared;
    bytes = static_cast<std::int64_t>(shared.bytes);
    uLong crc = ::crc32(0L, Z_NULL, 0);
    for (const auto& [name, off, n] : shared.buffers) {
      const std::string entry = name + ":" + std::to_string(off) + ":" + std::to_string(n) + ";";
      crc = ::crc32(crc, reinterpret_cast<const Bytef*>(entry.data()), static_cast<uInt>(entry.size()));
    }
    layout = static_cast<std::int64_t>(crc);
    // What can fail on one rank alone is done before the ranks compare notes: no rank is then
    // left in a broadcast the others never join.
    try {
      cut = ranges(shared.bytes, group.size());
      std::uint64_t largest = 0;
      for (const auto& [lo, hi] : cut) largest = std::max(largest, hi - lo);
      space.resize(shared.bytes);
      std::copy(shared.mine.begin(), shared.mine.end(), space.begin() + static_cast<std::ptrdiff_t>(cut[static_cast<std::size_t>(group.rank())].first));
      if (largest) buf.p = group.allocate(largest);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddprun state: cannot gather the replicated buffers: %s\n", e.what());
      ready = 0;
    }
  }
  const auto every = all_gather_on_host(group, {bytes, layout, ready});
  bool alike = true, any = false, all_ready = true;
  for (std::size_t r = 0; r < every.size() / 3; ++r) {
    alike = alike && every[3 * r] == bytes && every[3 * r + 1] == layout;
    any = any || every[3 * r] >= 0;
    all_ready = all_ready && every[3 * r + 2] == 1;
  }
  if (!any) return out;
  if (!alike || !all_ready) {
    std::fprintf(stderr, alike ? "ddprun state: a rank could not gather the replicated buffers (its error says why); "
                                 "starting without this state\n"
                               : "ddprun state: the ranks' states were not shared out alike (were the same buffers "
                                 "replicated on every rank?); starting without this state\n");
    return std::nullopt;
  }
  for (int owner = 0; owner < group.size(); ++owner) {
    const auto [lo, hi] = cut[static_cast<std::size_t>(owner)];
    if (hi == lo) continue;
    // Each range a multiple of 64 bytes (load_from checks the space's size): sent as floats, as bytes.
    if (owner == group.rank()) group.copy_to_device(buf.p, space.data() + lo, hi - lo);
    group.broadcast(buf.p, (hi - lo) / 4, DataType::kFloat32, owner);
    group.copy_to_host(space.data() + lo, buf.p, hi - lo);
  }
  for (const auto& [name, off, n] : out->shared->buffers) {
    out->buffers[name].assign(space.begin() + static_cast<std::ptrdiff_t>(off), space.begin() + static_cast<std::ptrdiff_t>(off + n));
  }
  out->shared.reset();
  return out;
}

// A shared-out state is loaded by the world that saved it, each rank as itself.
void check_shared(ProcessGroup& group, const std::optional<MemoryState::Loaded>& out) {
  if (!out || !out->shared) return;
  if (out->shared->world != group.size() || out->shared->rank != group.rank()) {
    throw Error("ddprun state: the state of step " + std::to_string(out->step) + " was saved as rank " +
                std::to_string(out->shared->rank) + " of " + std::to_string(out->shared->world) +
                ", its replicated buffers shared out among them; this is rank " + std::to_string(group.rank()) +
                " of " + std::to_string(group.size()) + ", which cannot gather them");
  }
}

}  // namespace

std::optional<MemoryState::Loaded> MemoryState::load(ProcessGroup& group) {
  wait();
  const auto [agreed, course] = agree(group, committed(map_, slot_bytes_));
  if (agreed < 0) return std::nullopt;
  auto out = gather(group, load_on_all(group, [&] {
                      auto o = load_from(map_, slot_bytes_, kSlots, agreed, "memory written outside MemoryState?", course);
                      check_shared(group, o);
                      return o;
                    }));
  if (out) drop_newer(agreed, course);
  return out;
}

// The states newer than the one the ranks agreed on are of a course the job abandoned: they go
// (uncommitted), so that the next save writes over one of them, never over the agreed one, and no
// later agreement takes one for the step it names. The header's latest names the agreed slot with
// the newest generation ever committed: generations are never used twice (the agent's copies
// count them).
void MemoryState::drop_newer(std::int64_t agreed, std::int64_t course) {
  int keep = -1;
  std::uint64_t keep_gen = 0, newest = header(map_).latest >> 1;
  for (const auto& [gen, step, slot] : committed(map_, slot_bytes_)) {
    if (step == agreed && static_cast<std::int64_t>(gen >> kCourseShift) == course && keep < 0) {
      keep = slot;
      keep_gen = gen;
    }
  }
  if (keep < 0) return;
  bool dropped = false;
  for (const auto& [gen, step, slot] : committed(map_, slot_bytes_)) {
    if (gen <= keep_gen) continue;  // newer by generation: whatever step it names
    newest = std::max(newest, gen);
    dropped = true;
    write_at<std::uint64_t>(map_ + page() + static_cast<std::size_t>(slot) * slot_bytes_, 0);
  }
  if (dropped) write_at<std::uint64_t>(map_ + 24, std::max(newest, keep_gen) << 1 | static_cast<std::uint64_t>(keep));
}

std::optional<MemoryState::Loaded> MemoryState::load(ProcessGroup& group, const std::string& path) {
  std::optional<StateFile> file;
  std::vector<std::tuple<std::uint64_t, std::int64_t, int>> held;
  try {
    file.emplace(path);
    held = committed(file->map(), file->slot_bytes(), 1);
  } catch (const Error& e) {  // this rank holds nothing from it, and still agrees
    std::fprintf(stderr, "%s; rank %d loads nothing from it\n", e.what(), group.rank());
  }
  const auto [agreed, course] = agree(group, held);
  if (agreed < 0) return std::nullopt;
  return gather(group, load_on_all(group, [&] {
                  auto o = load_from(file->map(), file->slot_bytes(), 1, agreed, path, course);
                  check_shared(group, o);
                  return o;
                }));
}

std::int64_t MemoryState::persist(const std::string& path, bool blocking, std::chrono::milliseconds timeout) {
  if (timeout < timeout.zero() || (timeout > timeout.zero() && !blocking)) {
    throw Error("ddprun state: persist: a timeout (" + std::to_string(timeout.count()) +
                " ms) needs blocking and a time over zero");
  }
  if (!map_) return -1;
  char resolved[PATH_MAX];
  std::string target = path;
  if (target.empty() || target[0] != '/') {
    if (!::getcwd(resolved, sizeof(resolved))) throw Error(std::string("ddprun state: getcwd: ") + std::strerror(errno));
    target = std::string(resolved) + "/" + path;
  }
  if (target.size() > kRequestPathBytes || target.find('\0') != std::string::npos) {
    throw Error("ddprun state: persist: the path " + path + " is too long (over " +
                std::to_string(kRequestPathBytes) + " bytes) or holds a NUL byte; use a shorter one");
  }
  if (blocking) wait();
  const auto held = committed(map_, slot_bytes_);
  // The last save, committed or still being copied (the agent waits for its commit).
  const std::uint64_t gen = last_gen_ ? last_gen_ : held.empty() ? 0 : std::get<0>(held.front());
  if (gen == 0) throw Error("ddprun state: persist: this rank has saved no state yet (save first)");
  // The request, a sequence lock: an odd number while it is written, the next even one once whole.
  unsigned char* request = map_ + kRequestAt;
  std::uint64_t number = read_at<std::uint64_t>(request);
  number += number & 1;
  write_at(request, number + 1);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  write_at(request + 8, gen);  // pinned until copied
  write_at(request + 16, static_cast<std::uint32_t>(target.size()));
  write_at(request + 20, std::uint32_t{0});
  std::memcpy(map_ + kRequestPathAt, target.data(), target.size());
  std::atomic_thread_fence(std::memory_order_seq_cst);
  write_at(request, number + 2);
  if (!blocking) return -1;
  const unsigned char* reply = map_ + kReplyAt;
  const auto since = std::chrono::steady_clock::now();
  while (reinterpret_cast<const std::atomic<std::uint64_t>*>(reply)->load() < number + 2) {
    if (timeout > timeout.zero() && std::chrono::steady_clock::now() - since > timeout) {
      throw Error("ddprun state: persist: the agent had not written " + target + " after " +
                  std::to_string(timeout.count()) + " ms (a slow or stuck file system?); it may still write it");
    }
    ::usleep(10000);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (const auto err = read_at<std::int32_t>(reply + 16)) {
    const auto length = std::min<std::size_t>(read_at<std::uint32_t>(reply + 20), kReplyMessageBytes);
    throw Error("ddprun state: persist: " + std::string(reinterpret_cast<const char*>(reply + 24), length));
  }
  return read_at<std::int64_t>(reply + 8);
}

}  // namespace ddprun::runtime
