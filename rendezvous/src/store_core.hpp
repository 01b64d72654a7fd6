#pragma once
// The store's state and the semantics of every operation, free of sockets and threads: the
// server calls it from its single I/O thread, the fuzzer and unit tests call it directly.
// Not thread-safe by design; one thread owns a StoreCore.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "request_parser.hpp"

namespace ddprun::rendezvous {

// A connection that can receive replies outside request/reply order: a WAIT woken by another
// client's SET, or a 1.13 watch notification.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual void deliver(std::string_view bytes) = 0;
};

// One pending WAIT. Shared between the session that issued it and the per-key wait lists;
// `active` turns false when it is answered, cancelled or its connection closes.
struct Waiter {
  std::weak_ptr<Peer> peer;
  std::size_t missing = 0;  // keys still absent
  bool active = true;
};

// What the core remembers about one connection.
struct Session {
  std::weak_ptr<Peer> peer;
  std::vector<std::shared_ptr<Waiter>> waits;  // may hold inactive entries, pruned lazily
};

class StoreCore {
 public:
  // Applies `req` from `session` and appends its reply (if the operation has one) to `out`.
  // Throws ProtocolError when the request is invalid in context (ADD on a non-numeric value);
  // the caller then closes that connection. The state is unchanged by a failed request.
  void handle(Session& session, const Request& req, std::string& out);

  // Forgets a closed connection's pending waits.
  void drop(Session& session);

  std::size_t num_keys() const { return data_.size(); }

 private:
  bool exists(const std::string& key) const;
  void put(const std::string& key, std::string value);  // set + watchers + wake
  void wake(const std::string& key);
  void notify_watchers(const std::string& key, std::uint8_t type, std::string_view old_value,
                       std::string_view new_value);
  void add_wait(Session& session, const std::vector<std::string>& keys, std::string& out);

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters_;
  std::unordered_map<std::string, std::vector<std::weak_ptr<Peer>>> watchers_;  // 1.13 WATCH_KEY
};

}  // namespace ddprun::rendezvous
