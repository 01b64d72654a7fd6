#pragma once
// The key-value store interface that agents, the runtime and Gloo's adapter program against.
// Keys and values are byte strings. Every blocking call is bounded by a timeout and throws
// ddprun::TimeoutError naming the keys, the server and the duration when it runs out.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rendezvous {

class Store {
 public:
  virtual ~Store() = default;

  // Sets key to value, waking waiters on key.
  virtual void set(std::string_view key, std::string_view value) = 0;
  // Waits (up to timeout()) for key to exist, then returns its value.
  virtual std::string get(std::string_view key) = 0;
  // Adds delta to the decimal integer at key (missing = 0) and returns the new value.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  // Atomically: if key holds `expected` (or is missing and `expected` is empty), stores
  // `desired`. Returns the value now at key, or `expected` when key is missing and expected is
  // not empty (PyTorch's semantics).
  virtual std::string compare_set(std::string_view key, std::string_view expected,
                                  std::string_view desired) = 0;
  // True when every key exists. Does not wait.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists, for at most `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Deletes key; true when it existed.
  virtual bool delete_key(std::string_view key) = 0;
  // Number of keys in the whole store (PyTorch counts its own bookkeeping keys too).
  virtual std::int64_t num_keys() = 0;
  // Appends value to key's value (creating it), waking waiters on key.
  virtual void append(std::string_view key, std::string_view value) = 0;
  // Values of keys, in order; a missing key gives an empty value. Does not wait.
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys) = 0;
  // Sets keys[i] to values[i] (sizes must match).
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) = 0;

  // The default timeout of blocking calls (get, wait).
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

}  // namespace ddprun::rendezvous
