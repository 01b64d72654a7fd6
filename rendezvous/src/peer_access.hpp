#pragma once
// Who may connect to a store: address allow-lists (CIDR), whether a peer is on this host, and
// which user owns the peer's socket (the kernel's sock_diag, looked up by the connection's
// address pair). No Asio: plain POSIX and netlink.

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rendezvous {

// An IPv4 or IPv6 address; IPv4-mapped IPv6 addresses are stored as IPv4.
struct IpAddress {
  int family = AF_UNSPEC;  // AF_INET or AF_INET6
  std::array<std::uint8_t, 16> bytes{};
  std::uint16_t port = 0;  // host order; 0 when not from a socket address

  static std::optional<IpAddress> from_sockaddr(const sockaddr_storage& sa);
  static std::optional<IpAddress> parse(const std::string& text);  // a literal, no port
  bool is_loopback() const;
  bool same_host_as(const IpAddress& o) const { return family == o.family && bytes == o.bytes; }
  std::string to_string() const;  // without the port
};

struct Cidr {
  IpAddress net;
  int prefix = 0;
  // "10.0.0.0/8", "fd00::/8", or an address alone (the whole address). Throws UsageError.
  static Cidr parse(const std::string& text);
  bool contains(const IpAddress& a) const;
  std::string to_string() const;
};

// "127.0.0.0/8,::1/128" and the like; throws UsageError naming the bad item.
std::vector<Cidr> parse_cidr_list(const std::string& text);

// The addresses of this host's interfaces (loopback included).
std::vector<IpAddress> local_addresses();

// What the kernel says about one TCP socket.
struct SocketInfo {
  uid_t uid = 0;
  std::uint8_t state = 0;   // TCP_ESTABLISHED, TCP_FIN_WAIT1, ... (netinet/tcp.h)
  std::uint32_t inode = 0;  // 0: no process holds the socket (closed; a time-wait socket)
  // The uid is the owner's only while a process holds an open socket: a socket its process
  // closed is orphaned (inode 0), and a time-wait one reports uid 0, as root's would.
  bool owner_known() const;
  std::string state_name() const;
};

// Looks up the owner of TCP sockets through NETLINK_SOCK_DIAG. One netlink socket, reused.
class SocketOwnerLookup {
 public:
  SocketOwnerLookup();
  ~SocketOwnerLookup();
  SocketOwnerLookup(const SocketOwnerLookup&) = delete;
  SocketOwnerLookup& operator=(const SocketOwnerLookup&) = delete;

  // The socket whose local end is `peer` and remote end is `local` (the client's end of a
  // connection this host accepted on `local`). nullopt when the kernel does not say (sock_diag
  // unavailable, the client's socket already gone); `error` then says why.
  std::optional<SocketInfo> lookup(const IpAddress& peer, const IpAddress& local, std::string* error = nullptr);

 private:
  int fd_ = -1;
  std::uint32_t seq_ = 0;
};

}  // namespace ddprun::rendezvous
