#pragma once
// The layout of a rank's in-memory state area (docs/usage.md: In-memory state), shared by
// Python's ddprun.state (packaging/wheel/ddprun/state.py, byte for byte), the runtime's
// MemoryState, and the agent, which owns the areas and persists them to disk:
//
//   header (a page): magic "DDPRUNST", u32 version 1, u32 slots, u64 slot bytes,
//                    u64 latest (generation << 1 | slot)
//     at 1024, the agent's answer to the last persist request: u64 request number answered,
//                    i64 step written, i32 errno (0: written), u32 message bytes, the message
//     at 1536, u64: the last request number whose slot the agent has copied (or given up)
//     at 1544, u64 replicated: the newest generation of this area whose step every rank's buddy
//                    holds (written by the agent)
//     at 1552, u64 copies: 1 while the agent copies this area's saves to a buddy node (written by
//                    the agent)
//     at 1560, u64 hold limit: the seconds a save waits for the copies at most before it goes on
//                    (the agent's own give-up, with a margin; 0: 60)
//     at 2048, the worker's persist request: u64 request number (odd while it is written, the
//                    next even number once whole), u64 the generation to persist, u32 path
//                    bytes, u32 0, the absolute path
//   slot i at page + i * slot bytes: its header (a page): u64 commit, u64 generation, i64 step,
//                    u64 skeleton bytes, u64 data bytes, u64 chunk bytes, u32 chunks, then a
//                    CRC-32 (zlib's) per chunk of the payload (the skeleton, then the data, at
//                    the next 64-byte boundary)
//
// An area has two slots. A persisted file has the same layout with one slot: a reader of
// either checks the same commit word and CRC-32s.
//
// A persist request pins its generation: until the agent has copied it (pinned_generation()), a
// save that would write its slot waits (on the save's thread), so that the state asked for is
// the state written, the same step on every rank that asked at the same step, and the area keeps
// two committed states throughout. A save never reuses a generation a request named.
//
// While the agent copies the saves to a buddy node (for the loss of a node), a save first waits
// until the area's newest state has been replicated (copies_hold()): a step counts as replicated
// once every rank's buddy holds it, and the job resumes from it after a node is lost (the lost
// node's ranks from their buddy, the others from their own area). So the area always keeps the
// last replicated state, every save is copied (none skipped, the same steps on every rank), and
// the state being copied, the newest, is never the one a save writes over.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ddprun::state_layout {

constexpr char kAreaMagic[8] = {'D', 'D', 'P', 'R', 'U', 'N', 'S', 'T'};
constexpr std::uint32_t kVersion = 1, kSlots = 2;
constexpr std::size_t kHeaderBytes = 32, kSlotHeaderBytes = 52, kAlign = 64;
constexpr std::size_t kLatestAt = 24;  // the header's latest (generation << 1 | slot)
constexpr std::size_t kReplyAt = 1024, kReplyMessageBytes = 480, kCopiedAt = 1536, kRequestAt = 2048;
constexpr std::size_t kReplicatedAt = 1544, kCopiesAt = 1552, kHoldLimitAt = 1560;
constexpr std::size_t kRequestPathAt = kRequestAt + 24, kRequestPathBytes = 2000;
// A save's generation >> kCourseShift is its course: in a job of several nodes the agent starts
// each round's generations at round << kCourseShift, and the ranks agree on a step and its course.
constexpr int kCourseShift = 40;

inline std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }
inline std::size_t align(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
inline std::size_t max_chunks() { return (page() - kSlotHeaderBytes) / 4; }
// The bytes of each slot of an area of `area_bytes` (its header page, then kSlots slots of whole pages).
inline std::uint64_t area_slot_bytes(std::uint64_t area_bytes) {
  return (area_bytes - page()) / kSlots / page() * page();
}

template <class T>
T read_at(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void write_at(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

struct Header {
  std::uint32_t version = 0, slots = 0;
  std::uint64_t slot_bytes = 0, latest = 0;
  bool magic = false;
};

inline Header header(const unsigned char* p) {
  Header h;
  h.magic = std::memcmp(p, kAreaMagic, 8) == 0;
  h.version = read_at<std::uint32_t>(p + 8);
  h.slots = read_at<std::uint32_t>(p + 12);
  h.slot_bytes = read_at<std::uint64_t>(p + 16);
  h.latest = read_at<std::uint64_t>(p + kLatestAt);
  return h;
}

inline void write_header(unsigned char* p, std::uint32_t slots, std::uint64_t slot_bytes, std::uint64_t latest) {
  std::memcpy(p, kAreaMagic, 8);
  write_at(p + 8, kVersion);
  write_at(p + 12, slots);
  write_at(p + 16, slot_bytes);
  write_at(p + kLatestAt, latest);
}

// The generation a persist request pins (a save must not write its slot), or 0: the request
// is whole and its slot not yet copied. `p`: the area's header page.
inline std::uint64_t pinned_generation(const unsigned char* p) {
  const auto number = read_at<std::uint64_t>(p + kRequestAt), copied = read_at<std::uint64_t>(p + kCopiedAt);
  return number % 2 == 0 && number > copied ? read_at<std::uint64_t>(p + kRequestAt + 8) : 0;
}

// Whether the agent's copies hold a save back: they are on, and the area's newest state has not
// been replicated yet. `p`: the area's header page.
inline bool copies_hold(const unsigned char* p) {
  return read_at<std::uint64_t>(p + kCopiesAt) == 1 &&
         (read_at<std::uint64_t>(p + kLatestAt) >> 1) > read_at<std::uint64_t>(p + kReplicatedAt);
}

// Whether a save that would write over generation `gen` must wait: a persist request pins `gen`,
// or the copies hold every save back. `p`: the area's header page.
inline bool pinned(const unsigned char* p, std::uint64_t gen) {
  return (gen != 0 && gen == pinned_generation(p)) || copies_hold(p);
}

struct SlotHeader {
  std::uint64_t commit = 0, gen = 0;
  std::int64_t step = 0;
  std::uint64_t skel = 0, data = 0, chunk = 0;
  std::uint32_t chunks = 0;

  std::uint64_t payload() const { return align(skel) + data; }
  // Committed, and its payload within a slot of `slot_bytes`.
  bool committed_within(std::uint64_t slot_bytes) const {
    return commit != 0 && commit == gen && slot_bytes > page() && skel <= slot_bytes && data <= slot_bytes &&
           payload() <= slot_bytes - page() && chunks <= max_chunks() && (chunks == 0 || chunk > 0);
  }
};

inline SlotHeader slot_header(const unsigned char* p) {
  SlotHeader h;
  h.commit = read_at<std::uint64_t>(p);
  h.gen = read_at<std::uint64_t>(p + 8);
  h.step = read_at<std::int64_t>(p + 16);
  h.skel = read_at<std::uint64_t>(p + 24);
  h.data = read_at<std::uint64_t>(p + 32);
  h.chunk = read_at<std::uint64_t>(p + 40);
  h.chunks = read_at<std::uint32_t>(p + 48);
  return h;
}

}  // namespace ddprun::state_layout
