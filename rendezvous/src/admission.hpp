#pragma once
// Who may connect to the store, decided as a connection is accepted (no Asio): the connection
// cap, the descriptors kept for the hosting process, the allowed addresses of other hosts, and
// the user owning a local peer's socket. Refusals are counted and logged without flooding.
//
// The verdict comes first: admit() runs on a socket just accepted, before it joins the epoll
// set, so not one byte of a connection is read (let alone applied) before it is admitted. The
// owner check takes the kernel's word only for a socket a process still holds open in
// ESTABLISHED state; anything else (a client that sent its requests and closed before we got
// to it) is refused, since a closed socket's owner cannot be known.

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "connection.hpp"
#include "peer_access.hpp"

namespace ddprun::rendezvous {

class Admission {
 public:
  explicit Admission(ServerContext& ctx);

  // Replaces the allowed addresses of other hosts (nullopt: any). Throws UsageError.
  void set_allow(const std::optional<std::vector<std::string>>& cidrs);
  // Whether `fd`, just accepted from `addr`, may become a client; when not, it is closed and the
  // refusal counted (and logged, at most once a second for the capacity limits). At capacity,
  // the oldest connection still authenticating is closed to make room, if there is one.
  bool admit(int fd, const sockaddr_storage& addr, std::size_t fd_limit);
  // The connection's socket options: no Nagle delay, at most kMaxUnsentInKernel bytes queued
  // in the kernel beyond the peer's window (TCP_NOTSENT_LOWAT), TCP keep-alive probes when
  // configured.
  void configure(int fd) const;
  static constexpr std::size_t kMaxUnsentInKernel = 128 * 1024;
  // A refusal for want of capacity, logged at most once a second.
  void refuse_for_capacity(const std::string& why);

 private:
  bool admit_peer(int fd, const sockaddr_storage& addr);
  const std::vector<IpAddress>& local_addrs();
  void turn_away(int fd);

  ServerContext& ctx_;
  std::optional<std::vector<Cidr>> allow_;
  std::optional<std::vector<IpAddress>> local_addrs_;  // this host's addresses, once asked
  SocketOwnerLookup owners_;
  uid_t my_uid_;
};

}  // namespace ddprun::rendezvous
