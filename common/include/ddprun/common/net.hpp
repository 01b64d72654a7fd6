#pragma once
// This machine's view of the network: its own addresses, what a name resolves to, and which of
// its addresses the kernel would use to reach another host. Addresses are numeric text
// ("10.0.0.1", "fd00::1"), without an IPv6 scope.

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun {

// Every address of this machine's interfaces (loopback included), in the kernel's order.
std::vector<std::string> local_addresses();

// The numeric addresses `host` resolves to (a literal resolves to itself); empty when it does
// not resolve (yet).
std::vector<std::string> resolve_host(const std::string& host);

bool is_ip_literal(const std::string& address);

// Why `host` cannot be a DNS name, or "" when it can (or is an IP literal): over 253 characters,
// a label over 63, or an empty label (RFC 1035 2.3.4). Checked before a name goes to the
// resolver, which would otherwise be asked again and again until a join timeout.
std::string host_name_problem(const std::string& host);
// 127.0.0.0/8, ::1, and IPv4-mapped loopback.
bool is_loopback(const std::string& address);

// The source address this machine would use for a connection to `host` (a name or a literal):
// the kernel's routing decision, read from an unconnected UDP socket (no packet is sent).
// Empty when `host` does not resolve or no route leads there.
std::string source_address_towards(const std::string& host);

// The numeric address the socket `fd` is bound to ("" when it is not, or is not IP).
std::string bound_address(int fd);

}  // namespace ddprun
