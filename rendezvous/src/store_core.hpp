#pragma once
// The store's state and the semantics of every operation, free of sockets and threads: the
// server calls it from its single I/O thread, the fuzzer and unit tests call it directly.
// Not thread-safe by design; one thread owns a StoreCore.
//
// Every way a request can make the store hold more memory is capped (StoreLimits): the bytes
// held in all keys and queues, one value (APPEND included), one reply, the keys one connection
// waits on or watches, one queue's length. A request over a cap throws LimitError before it
// changes anything; the server closes that client's connection and everyone else goes on.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ddprun/common/error.hpp"
#include "request_parser.hpp"

namespace ddprun::rendezvous {

// A request over one of the StoreLimits. The message names the option that sets the cap.
class LimitError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

struct StoreLimits {
  std::size_t max_value_bytes = 8 * 1024 * 1024;         // a value, also as APPEND grows it
  std::size_t max_reply_bytes = 32 * 1024 * 1024;        // one reply (MULTI_GET)
  std::size_t max_store_bytes = std::size_t{1} << 30;    // keys + values + queued items, in all
  std::size_t max_waits_per_connection = 128 * 1024;     // keys one connection waits on at once
  std::size_t max_watches_per_connection = 1024;         // WATCH_KEY registrations (1.13)
  std::size_t max_queue_length = 1024 * 1024;            // items in one queue
};

// A connection that can receive replies outside request/reply order: a WAIT woken by another
// client's SET, or a 1.13 watch notification.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual void deliver(std::string_view bytes) = 0;
};

struct Session;

// One pending WAIT. Shared between the session that issued it and the per-key wait lists;
// `active` turns false when it is answered, cancelled or its connection closes.
struct Waiter {
  Session* session = nullptr;  // valid while active
  std::size_t missing = 0;     // keys still absent
  bool active = true;
  // The keys it waits on, each with the generation of the wait list it joined (a key's list is
  // replaced when the key is set), so that a drop removes it only from lists it is still in.
  std::vector<std::pair<std::string, std::uint64_t>> keys;
};

// What the core remembers about one connection.
struct Session {
  std::weak_ptr<Peer> peer;
  std::vector<std::shared_ptr<Waiter>> waits;  // may hold inactive entries, pruned when they dominate
  std::size_t active_waits = 0;
  std::size_t wait_keys = 0;                   // keys waited on by its active waits
  std::vector<std::string> watches;            // keys it watches (1.13), one entry per registration
};

struct StoreStats {
  std::size_t keys = 0;
  std::size_t store_bytes = 0;     // what max_store_bytes caps
  std::size_t wait_lists = 0;      // keys somebody waits on
  std::size_t wait_entries = 0;    // entries in those lists (live and not yet pruned)
  std::size_t watch_entries = 0;
};

class StoreCore {
 public:
  explicit StoreCore(StoreLimits limits = {}) : limits_(limits) {}

  // Applies `req` from `session` and appends its reply (if the operation has one) to `out`.
  // Throws ProtocolError when the request is invalid in context (ADD on a non-numeric value) and
  // LimitError when it is over a cap; the caller then closes that connection. The state is
  // unchanged by a failed request.
  void handle(Session& session, const Request& req, std::string& out);

  // Forgets a closed connection: its pending waits and its watches.
  void drop(Session& session);

  std::size_t num_keys() const { return data_.size(); }
  StoreStats stats() const;
  const StoreLimits& limits() const { return limits_; }

 private:
  struct WaitList {
    std::vector<std::shared_ptr<Waiter>> entries;
    std::size_t live = 0;
    std::uint64_t generation = 0;
  };

  bool exists(const std::string& key) const;
  void put(const std::string& key, std::string value);  // set + watchers + wake (quota checked by caller)
  void wake(const std::string& key);
  void notify_watchers(const std::string& key, std::uint8_t type, std::string_view old_value,
                       std::string_view new_value);
  void add_wait(Session& session, const std::vector<std::string>& keys, std::string& out);
  // One operation each (handle() dispatches).
  void compare_set(const Request& req, std::string& out);
  void add(const Request& req, std::string& out);
  void watch_key(Session& session, const Request& req, std::string& out);
  void delete_key(const Request& req, std::string& out);
  void append(const Request& req, std::string& out);
  void multi_get(const Request& req, std::string& out);
  void multi_set(const Request& req, std::string& out);
  void queue_push(const Request& req, std::string& out);
  void queue_pop(const Request& req, std::string& out);
  void cancel_waits(Session& session);
  // Throws LimitError unless the store can grow by `grow` bytes after freeing `shrink`.
  void check_quota(std::size_t grow, std::size_t shrink, const char* op, const std::string& key) const;
  void check_value(std::size_t size, const char* op, const std::string& key) const;
  std::size_t held(const std::string& key) const;  // bytes a key's value accounts for (0 when absent)

  StoreLimits limits_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, WaitList> waiters_;
  std::unordered_map<std::string, std::vector<Session*>> watchers_;  // 1.13 WATCH_KEY
  std::size_t bytes_ = 0;
  std::uint64_t next_generation_ = 1;
};

}  // namespace ddprun::rendezvous
