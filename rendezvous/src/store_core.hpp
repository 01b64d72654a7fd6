#pragma once
// The store's state and the semantics of every operation, free of sockets and threads: the
// server calls it from its single I/O thread, the fuzzer and unit tests call it directly.
// Not thread-safe by design; one thread owns a StoreCore.
//
// Memory: everything a request makes the store hold (keys, values, queues and their items,
// WAIT and WATCH registrations, each with its overhead) is charged to one MemoryBudget, which
// the server shares with the connections' buffers. A request that does not fit throws
// LimitError before it changes anything; so does a request over one of the per-request or
// per-connection caps (StoreLimits). The server then closes that client's connection; everyone
// else goes on. Values are shared buffers (memory_budget.hpp): replies and watch events carry
// them by reference.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/common/error.hpp"
#include "key_map.hpp"
#include "memory_budget.hpp"
#include "message.hpp"
#include "request_parser.hpp"

namespace ddprun::rendezvous {

// A request over one of the StoreLimits or the memory budget. The message names the option.
class LimitError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

struct StoreLimits {
  std::size_t max_value_bytes = 8 * 1024 * 1024;         // a value, also as APPEND grows it
  std::size_t max_reply_bytes = 32 * 1024 * 1024;        // one reply (MULTI_GET)
  std::size_t max_store_bytes = std::size_t{1} << 30;    // the memory budget (when the core owns it)
  std::size_t max_waits_per_connection = 128 * 1024;     // keys one connection waits on at once
  std::size_t max_watches_per_connection = 1024;         // WATCH_KEY registrations (1.13)
  std::size_t max_queue_length = 1024 * 1024;            // items in one queue
};

// A connection that can receive output outside request/reply order: a WAIT woken by another
// client's SET, or a 1.13 watch event. It charges what it queues to the budget, and closes
// itself (not the sender) when that does not fit.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual void deliver(const Message& m) = 0;
};

struct Session;

// A key's value. Small ones (under Message::kShareFrom: copied into replies anyway) are the
// store's own string, overwritten in place as the key changes (no allocation per SET); large ones
// are shared buffers, sent by reference.
struct StoredValue {
  std::string small;
  SharedBytes large;
  std::string_view view() const { return large ? large->view() : std::string_view(small); }
  std::size_t size() const { return large ? large->size() : small.size(); }
  // What dropping it frees now (a shared buffer only when nothing else holds it).
  std::size_t freed_by_drop() const { return cost::string_heap(small) + rendezvous::freed_by_drop(large); }
};

// One pending WAIT, owned by its session and listed under each key it still waits for.
struct Waiter {
  static constexpr std::size_t kWoken = ~std::size_t{0};
  struct Key {
    const std::string* name;  // the key of its wait list (stable while the list exists)
    std::size_t hash;
    std::size_t index;        // its entry in that list; kWoken once the key was set
  };
  Session* session = nullptr;
  std::size_t slot = 0;        // index in session->waits
  std::size_t missing = 0;     // keys still absent
  std::vector<Key> keys;
  std::size_t charged = 0;
};

// What the core remembers about one connection.
struct Session {
  std::weak_ptr<Peer> peer;
  std::vector<std::unique_ptr<Waiter>> waits;  // pending, in no order
  std::size_t wait_keys = 0;                   // keys waited on by them
  std::vector<std::string> watches;            // keys it watches (1.13), one entry per registration
};

struct StoreStats {
  std::size_t keys = 0;
  std::size_t store_bytes = 0;     // key and value bytes of keys and queued items
  std::size_t memory_bytes = 0;    // the whole budget in use (with the connections' buffers)
  std::size_t wait_lists = 0;      // keys somebody waits on
  std::size_t wait_entries = 0;
  std::size_t watch_entries = 0;
  std::size_t waits_woken = 0;     // since start (clear() keeps it)
};

class StoreCore {
 public:
  // Charges `budget` (shared with the server's connections), or one of its own of
  // limits.max_store_bytes when null.
  explicit StoreCore(StoreLimits limits = {}, MemoryBudget* budget = nullptr);
  ~StoreCore();
  StoreCore(const StoreCore&) = delete;
  StoreCore& operator=(const StoreCore&) = delete;

  // Applies `req` from `session` and appends its reply (if the operation has one) to `out`.
  // Takes values out of `req` (they become the store's, uncopied). Throws ProtocolError when the
  // request is invalid in context (ADD on a non-numeric value) and LimitError when it is over a
  // cap or the budget; the state is then unchanged.
  void handle(Session& session, Request& req, Message& out);

  // Forgets a closed connection: its pending waits and its watches.
  void drop(Session& session) { drop_some(session, ~std::size_t{0}); }
  // As drop(), a part at a time: up to `max_waits` of its waits (the most recent first), then,
  // once none is left, its watches. Returns how many waits are left.
  std::size_t drop_some(Session& session, std::size_t max_waits);
  // Forgets every key, queue, wait and watch (every session must have been dropped).
  void clear();

  std::size_t num_keys() const { return data_.size(); }
  StoreStats stats() const;
  const StoreLimits& limits() const { return limits_; }
  MemoryBudget& budget() { return *budget_; }

 private:
  struct WaitEntry {
    Waiter* waiter;
    std::size_t key;  // index in waiter->keys
  };
  struct WaitList {
    std::vector<WaitEntry> entries;
    std::size_t charged = 0;
  };

  // Values and keys (store_core.cpp). `h` is the hashed key of the request's first key.
  bool exists(const HashedKey& k) const;
  // Sets `k` to `large`, or to a copy of `small` when `large` is null; then watchers, waiters.
  void put(const HashedKey& k, std::string_view small, SharedBytes large);
  void set_value(const HashedKey& k, std::string&& value, const char* op);
  void compare_set(Request& req, const HashedKey& h, Message& out);
  void add(const Request& req, const HashedKey& h, Message& out);
  void delete_key(const HashedKey& h, Message& out);
  void append(Request& req, const HashedKey& h);
  void multi_get(const Request& req, Message& out);
  void multi_set(Request& req);
  void queue_push(Request& req, const HashedKey& h);
  void queue_pop(const HashedKey& h, Message& out);
  // Throws LimitError unless `grow` more bytes fit once `shrink` are freed.
  void require(std::size_t grow, std::size_t shrink, const char* op, std::string_view key) const;
  void check_value(std::size_t size, const char* op, std::string_view key) const;
  void charge(std::size_t n);
  void release(std::size_t n);

  // Waits and watches (store_waits.cpp).
  void add_wait(Session& session, const std::vector<std::string>& keys, Message& out);
  void wake(const HashedKey& k);
  void cancel_waits(Session& session);
  void unlist(const Waiter::Key& k);
  std::unique_ptr<Waiter> take_waiter(Session& session, std::size_t slot);
  void watch_key(Session& session, const HashedKey& h, Message& out);
  void unwatch(Session& session);
  void notify_watchers(const HashedKey& k, std::uint8_t type, const StoredValue& old_value,
                       const StoredValue& new_value);

  StoreLimits limits_;
  std::unique_ptr<MemoryBudget> own_budget_;
  MemoryBudget* budget_;
  KeyMap<StoredValue> data_;
  KeyMap<std::deque<SharedBytes>> queues_;
  KeyMap<WaitList> waiters_;
  KeyMap<std::vector<Session*>> watchers_;  // 1.13 WATCH_KEY
  std::size_t bytes_ = 0;    // key and value bytes (stats)
  std::size_t woken_ = 0;    // WAITs answered by a set (stats)
  std::size_t charged_ = 0;  // what the core charged to the budget, besides the shared buffers
};

}  // namespace ddprun::rendezvous
