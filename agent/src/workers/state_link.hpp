#pragma once
// Copies of the workers' committed state between the agents of a job (docs/usage.md: State
// across nodes): a small TCP server on each agent of a multi-node job, and the two requests a
// peer makes of it.
//
// Every connection starts with a mutual HMAC-SHA256 challenge over fresh nonces
// (ddprun/rendezvous/auth.hpp's proofs) with the round's copy key: derived from the job's secret,
// else a random key that the round's first agent to need one puts in the round's workers' store
// (readable by the job's members only).
// Then one request:
//
//   client -> server  u8 op, i32 rank, u64 bytes
//   op 'P' (put): `bytes` of a slot image (its header page, then its payload), then u8 1 if the
//                 sender still found the slot committed after reading it (0: discard it);
//                 server -> client u8 0 (kept) or 1 (refused: malformed, or over the budget)
//   op 'G' (get): server -> client u32 count (0..2), then for each image u64 bytes, the image,
//                 oldest first
//
// The server keeps, per rank, the two newest complete images it was given (a put replaces the
// older only once it is whole), within a byte budget. Their CRC-32s are checked where they are
// loaded (ddprun.state.load), as a worker's own saves are: while the copies run, a worker never
// writes the state being copied (it waits until it is replicated), and the sender checks after
// the copy that the slot was not written meanwhile. It serves up to 8
// connections at once, each on a thread of its own; a client has 2 s to prove the key, then may
// be idle 10 s at most. No thread runs before start().

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddprun/common/state_layout.hpp"

namespace ddprun::agent {

struct StateImage {
  std::uint64_t gen = 0;
  std::int64_t step = 0;
  std::uint64_t bytes = 0;
  std::shared_ptr<unsigned char[]> data;  // the slot header page, then the payload
  int round = 0;                          // the round it was taken in (a copy or a retired area)
};

// The header of a slot image, checked: committed, and its payload within `bytes`. nullopt: not one.
std::optional<state_layout::SlotHeader> image_header(const unsigned char* data, std::uint64_t bytes);
// The round's copy key derived from the job's secret: HMAC-SHA256(secret, label), hex. Throws
// ddprun::Error where libcrypto cannot be loaded.
std::string derive_key(const std::string& secret, const std::string& label);

class StateLinkServer {
 public:
  // `budget`: the bytes of images it holds at most.
  explicit StateLinkServer(std::uint64_t budget);
  ~StateLinkServer();
  StateLinkServer(const StateLinkServer&) = delete;
  StateLinkServer& operator=(const StateLinkServer&) = delete;

  // Listens on every address, a port of the kernel's choosing, and serves on a thread of its own.
  // Throws ddprun::Error where it cannot.
  void start();
  bool started() const { return thread_.joinable(); }
  std::uint16_t port() const { return port_; }
  // Where the key a client must prove it knows comes from (the round's: clients of an older
  // round are refused). Asked on a connection's thread as it comes; where it throws, the
  // connection is refused.
  void set_key(std::function<std::string()> key);
  void set_key(const std::string& key) {
    set_key([key] { return key; });
  }

  // Keeps `image` as one of `rank`'s (as a put does). False: over the budget.
  bool keep(int rank, StateImage image);
  // `rank`'s images, oldest first.
  std::vector<StateImage> images(int rank) const;
  // The ranks it holds images of.
  std::vector<int> ranks() const;
  // Drops every image taken in a round before `round`.
  void drop_before(int round);
  std::uint64_t held_bytes() const;
  int round() const { return round_.load(); }
  void set_round(int round) { round_.store(round); }

 private:
  struct Connection;
  void run();
  void serve(int fd);
  void reap(bool all);  // joins the connections' threads that ended (all: every one, cut short)

  const std::uint64_t budget_;
  int listen_fd_ = -1, stop_fd_ = -1;  // stop_fd_: an eventfd that ends run()
  std::uint16_t port_ = 0;
  std::atomic<int> round_{0};
  mutable std::mutex mu_;
  std::function<std::string()> key_;
  std::map<int, std::vector<StateImage>> held_;
  std::uint64_t held_bytes_ = 0;
  std::thread thread_;
  std::vector<std::unique_ptr<Connection>> connections_;  // the server thread's
};

// A connection to a peer's StateLinkServer, authenticated with `key`. Every call throws
// ddprun::Error saying what failed; each read and write is bounded at `timeout_ms`.
class StateLinkClient {
 public:
  StateLinkClient(const std::string& host, std::uint16_t port, const std::string& key, int timeout_ms = 10000);
  // A server's address as published, "host:port", split at its last colon (an IPv6 literal
  // keeps its own); the port 1 to 65535. Throws ddprun::Error on anything else.
  static std::pair<std::string, std::uint16_t> split_address(const std::string& host_port);
  ~StateLinkClient();
  StateLinkClient(const StateLinkClient&) = delete;
  StateLinkClient& operator=(const StateLinkClient&) = delete;

  // Sends `bytes` of the memfd `fd` from `offset` as `rank`'s image, at most `bytes_per_s` (0:
  // no bound), then asks `intact()` whether to keep it. False: the server refused it. `stop`
  // ends it early (throws).
  template <typename Intact>
  bool put(int rank, int fd, std::uint64_t offset, std::uint64_t bytes, std::uint64_t bytes_per_s,
           const std::atomic<bool>& stop, Intact intact) {
    send_put(rank, fd, offset, bytes, bytes_per_s, stop);
    return finish_put(intact());
  }
  int fd() const { return fd_; }
  // `rank`'s images the server holds, oldest first; an image over `max_bytes` is refused.
  std::vector<StateImage> get(int rank, std::uint64_t max_bytes);

 private:
  void send_put(int rank, int fd, std::uint64_t offset, std::uint64_t bytes, std::uint64_t bytes_per_s,
                const std::atomic<bool>& stop);
  bool finish_put(bool intact);

  int fd_ = -1;
  std::string where_;
};

}  // namespace ddprun::agent
