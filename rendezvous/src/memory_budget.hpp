#pragma once
// The store's one memory budget (--max_store_bytes, as Redis's maxmemory), and the byte buffers
// it counts. Everything a client can make the store hold is charged here while it is held: keys
// and values with their per-key and per-item overhead, queues, WAIT and WATCH registrations,
// and each connection's buffers (the request being received, unsent replies and notifications,
// its fixed cost). A value is one immutable, reference-counted buffer, shared by the store and
// by every unsent reply or watch event that carries it: it is charged once, while it lives,
// and sending it to 200 watchers copies nothing.
//
// Costs are what the allocations take (glibc malloc, libstdc++), rounded up; the constants below
// were checked against the RSS of a store holding a million of each thing (README, "Memory").
// Not thread-safe: one I/O thread owns a budget.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace ddprun::rendezvous {

namespace cost {
// One heap allocation of `n` bytes: glibc's header and 16-byte rounding; from 128 KiB on (the
// mmap threshold the store fixes) whole pages.
constexpr std::size_t malloc_bytes(std::size_t n) {
  if (n == 0) return 0;
  if (n >= 128 * 1024) return (n + 16 + 4095) / 4096 * 4096;
  return (n + 8 + 15) / 16 * 16;
}
// The heap block of a std::string with this capacity (none for the 15 bytes kept inline).
constexpr std::size_t string_heap(std::size_t capacity) { return capacity <= 15 ? 0 : malloc_bytes(capacity + 1); }
inline std::size_t string_heap(const std::string& s) { return string_heap(s.capacity()); }

constexpr std::size_t kBuffer = 96;         // a shared buffer's control block and header
constexpr std::size_t kKey = 160;           // a key's hash-map node (with an inline value) and bucket
constexpr std::size_t kQueue = 1024;        // a queue's node, deque and first block
constexpr std::size_t kQueueItem = 32;      // one item's slot in a deque
constexpr std::size_t kWaiter = 128;        // one pending WAIT
constexpr std::size_t kWaitKey = 48;        // one key of a pending WAIT (its slot in two lists)
constexpr std::size_t kWaitList = 160;      // a key somebody waits on: its node and list
constexpr std::size_t kWatch = 160;         // one WATCH_KEY registration (two slots, a node share)
constexpr std::size_t kOutputChunk = 96;    // one queued piece of output (a deque slot)
constexpr std::size_t kConnection = 4096;   // a connection's fixed objects (parser, session, epoll)
}  // namespace cost

class MemoryBudget {
 public:
  explicit MemoryBudget(std::size_t limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  std::size_t limit() const { return limit_; }
  std::size_t used() const { return used_; }
  std::size_t left() const { return used_ >= limit_ ? 0 : limit_ - used_; }
  // Whether `grow` more bytes fit once `shrink` bytes are freed.
  bool fits(std::size_t grow, std::size_t shrink = 0) const { return grow <= shrink || grow - shrink <= left(); }
  void charge(std::size_t n) { used_ += n; }
  void release(std::size_t n) { used_ -= n; }

 private:
  std::size_t limit_;
  std::size_t used_ = 0;
};

// A changing amount held on a budget (a connection's buffers, a list's capacity), released when
// it ends.
class Tally {
 public:
  Tally() = default;
  explicit Tally(MemoryBudget& b) : budget_(&b) {}
  Tally(const Tally&) = delete;
  Tally& operator=(const Tally&) = delete;
  ~Tally() { set(0); }
  // Sets the amount held to `n`, charging or releasing the difference.
  void set(std::size_t n) {
    if (!budget_) return;
    if (n > held_) budget_->charge(n - held_);
    else budget_->release(held_ - n);
    held_ = n;
  }
  std::size_t held() const { return held_; }

 private:
  MemoryBudget* budget_ = nullptr;
  std::size_t held_ = 0;
};

// Immutable bytes, charged to a budget from creation to destruction.
class Bytes {
 public:
  Bytes(MemoryBudget& budget, std::string&& data)
      : data_(std::move(data)), budget_(&budget), cost_(cost::kBuffer + cost::string_heap(data_)) {
    budget_->charge(cost_);
  }
  ~Bytes() { budget_->release(cost_); }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;

  std::string_view view() const { return data_; }
  std::size_t size() const { return data_.size(); }
  std::size_t cost() const { return cost_; }

 private:
  std::string data_;
  MemoryBudget* budget_;
  std::size_t cost_;
};

// A value as the store and unsent replies hold it; null for the empty value (which costs no
// buffer).
using SharedBytes = std::shared_ptr<const Bytes>;

// Takes `data` (no copy) into a shared buffer charged to `budget`; null when it is empty.
inline SharedBytes share(MemoryBudget& budget, std::string&& data) {
  if (data.empty()) return nullptr;
  return std::make_shared<const Bytes>(budget, std::move(data));
}
// What share() of a string of this capacity will charge.
constexpr std::size_t shared_cost(std::size_t size, std::size_t capacity) {
  return size == 0 ? 0 : cost::kBuffer + cost::string_heap(capacity);
}
inline std::string_view view(const SharedBytes& b) { return b ? b->view() : std::string_view(); }
inline std::size_t size_of(const SharedBytes& b) { return b ? b->size() : 0; }
// Bytes that dropping the store's reference would free: the buffer's cost when nobody else
// (an unsent reply, a watch event) holds it.
inline std::size_t freed_by_drop(const SharedBytes& b) { return b && b.use_count() == 1 ? b->cost() : 0; }

}  // namespace ddprun::rendezvous
