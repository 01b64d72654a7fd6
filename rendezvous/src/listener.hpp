#pragma once
// The store's listening socket: bound to the first address `host` resolves to that can be bound
// (every interface, IPv6 and IPv4, when empty), listening with the system's largest backlog,
// non-blocking, not inherited by processes the host spawns. And the open-file limit.

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::rendezvous {

using tcp = boost::asio::ip::tcp;

struct ListenAddress {
  std::string host;  // as bound: "127.0.0.1", "::"
  std::uint16_t port = 0;
};

// Throws AddressInUseError (the port is taken) or NetworkError naming the address.
ListenAddress listen_on(tcp::acceptor& acceptor, const std::string& host, std::uint16_t port);

// Raises RLIMIT_NOFILE to its hard limit when `raise`; returns the (new) soft limit.
std::size_t raise_fd_limit(bool raise);

}  // namespace ddprun::rendezvous
