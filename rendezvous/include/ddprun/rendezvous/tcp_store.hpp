#pragma once
// Client of a TCPStore server (ddprun-store, an agent's in-process store, or PyTorch's own),
// speaking PyTorch 2.x's protocol: VALIDATE and PING on connect. Like PyTorch's client it
// prefixes every key with "/", so ddprun and PyTorch processes see the same keys.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/rendezvous/store.hpp"

namespace ddprun::rendezvous {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
  // Bounds connecting (retried with backoff: the server may start later) and every blocking
  // call. PyTorch's default is 300 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // Non-empty: authenticate with ddprun's HMAC handshake before any request, and accept only a
  // server that proves it knows the same secret. Throws AuthError when either side refuses.
  std::string secret;
  // The settings that pointed this client here (e.g. "--rdzv_endpoint, --rdzv_backend",
  // "MASTER_ADDR, MASTER_PORT"), named where what answers there is not a store; empty: none.
  std::string pointed_by;
};

// Thread-safe: calls from several threads are serialised on the one connection.
class TcpStore final : public Store {
 public:
  // Connects, retrying until options.timeout. Throws TimeoutError naming the address, and
  // AuthError (at once, no retry) when the server refuses this client's secret or lack of one.
  // A store that turns the client away for capacity is tried again until the time-out; the
  // TimeoutError then says the store was at capacity.
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;
  std::chrono::milliseconds timeout() const override;
  void set_timeout(std::chrono::milliseconds timeout) override;

  // Round trip to the server; returns false when it does not answer within `timeout`.
  bool ping(std::chrono::milliseconds timeout);

  // "host:port" of the server.
  std::string address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
