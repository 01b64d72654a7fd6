#include "peer_access.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::rendezvous {

std::optional<IpAddress> IpAddress::from_sockaddr(const sockaddr_storage& sa) {
  IpAddress a;
  if (sa.ss_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(&sa);
    a.family = AF_INET;
    std::memcpy(a.bytes.data(), &in4->sin_addr, 4);
    a.port = ntohs(in4->sin_port);
    return a;
  }
  if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    a.port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      a.family = AF_INET;
      std::memcpy(a.bytes.data(), in6->sin6_addr.s6_addr + 12, 4);
    } else {
      a.family = AF_INET6;
      std::memcpy(a.bytes.data(), in6->sin6_addr.s6_addr, 16);
    }
    return a;
  }
  return std::nullopt;
}

std::optional<IpAddress> IpAddress::parse(const std::string& text) {
  IpAddress a;
  std::string t = text;
  if (t.size() > 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  in6_addr v6{};
  if (::inet_pton(AF_INET, t.c_str(), a.bytes.data()) == 1) {
    a.family = AF_INET;
    return a;
  }
  if (::inet_pton(AF_INET6, t.substr(0, t.find('%')).c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      a.family = AF_INET;
      std::memcpy(a.bytes.data(), v6.s6_addr + 12, 4);
    } else {
      a.family = AF_INET6;
      std::memcpy(a.bytes.data(), v6.s6_addr, 16);
    }
    return a;
  }
  return std::nullopt;
}

bool IpAddress::is_loopback() const {
  if (family == AF_INET) return bytes[0] == 127;
  if (family == AF_INET6) {
    static const std::array<std::uint8_t, 16> kOne = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return bytes == kOne;
  }
  return false;
}

std::string IpAddress::to_string() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (family == AF_INET || family == AF_INET6) ::inet_ntop(family, bytes.data(), buf, sizeof(buf));
  return buf;
}

Cidr Cidr::parse(const std::string& text) {
  auto slash = text.find('/');
  std::string addr = text.substr(0, slash);
  auto a = IpAddress::parse(addr);
  if (!a) throw UsageError("'" + text + "' is not an address or CIDR block (examples: 10.0.0.0/8, fd00::/8, 192.168.1.7)");
  Cidr c;
  c.net = *a;
  int max = a->family == AF_INET ? 32 : 128;
  c.prefix = max;
  if (slash != std::string::npos) {
    std::string p = text.substr(slash + 1);
    auto v = parse_int(p, 0, max);
    if (!v) {
      throw UsageError("'" + text + "': the prefix length must be 0-" + std::to_string(max));
    }
    c.prefix = static_cast<int>(*v);
  }
  return c;
}

bool Cidr::contains(const IpAddress& a) const {
  if (a.family != net.family) return false;
  int full = prefix / 8, rest = prefix % 8;
  if (std::memcmp(a.bytes.data(), net.bytes.data(), full) != 0) return false;
  if (rest == 0) return true;
  auto mask = static_cast<std::uint8_t>(0xFF << (8 - rest));
  return (a.bytes[full] & mask) == (net.bytes[full] & mask);
}

std::string Cidr::to_string() const { return net.to_string() + "/" + std::to_string(prefix); }

std::vector<Cidr> parse_cidr_list(const std::string& text) {
  std::vector<Cidr> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    if (!item.empty()) out.push_back(Cidr::parse(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<IpAddress> local_addresses() {
  std::vector<IpAddress> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (auto* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    sockaddr_storage ss{};
    if (i->ifa_addr->sa_family == AF_INET) {
      std::memcpy(&ss, i->ifa_addr, sizeof(sockaddr_in));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      std::memcpy(&ss, i->ifa_addr, sizeof(sockaddr_in6));
    } else {
      continue;
    }
    if (auto a = IpAddress::from_sockaddr(ss)) out.push_back(*a);
  }
  ::freeifaddrs(ifs);
  return out;
}

SocketOwnerLookup::SocketOwnerLookup() {
  fd_ = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
}

SocketOwnerLookup::~SocketOwnerLookup() {
  if (fd_ >= 0) ::close(fd_);
}

bool SocketInfo::owner_known() const { return state == TCP_ESTABLISHED && inode != 0; }

std::string SocketInfo::state_name() const {
  static const char* const kNames[] = {"?",          "ESTABLISHED", "SYN-SENT",  "SYN-RECV", "FIN-WAIT-1",
                                       "FIN-WAIT-2", "TIME-WAIT",   "CLOSE",     "CLOSE-WAIT", "LAST-ACK",
                                       "LISTEN",     "CLOSING"};
  return state < sizeof(kNames) / sizeof(kNames[0]) ? kNames[state] : "state " + std::to_string(state);
}

std::optional<SocketInfo> SocketOwnerLookup::lookup(const IpAddress& peer, const IpAddress& local,
                                                    std::string* error) {
  auto fail = [&](std::string why) -> std::optional<SocketInfo> {
    if (error) *error = std::move(why);
    return std::nullopt;
  };
  if (fd_ < 0) return fail(std::string("no sock_diag netlink socket: ") + std::strerror(errno));
  if (peer.family != local.family) return fail("address families differ");
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.nlh.nlmsg_seq = ++seq_;
  msg.req.sdiag_family = static_cast<std::uint8_t>(peer.family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0U;
  // The client's socket, seen from its own side: source = the peer, destination = us.
  msg.req.id.idiag_sport = htons(peer.port);
  msg.req.id.idiag_dport = htons(local.port);
  std::memcpy(msg.req.id.idiag_src, peer.bytes.data(), peer.family == AF_INET ? 4 : 16);
  std::memcpy(msg.req.id.idiag_dst, local.bytes.data(), local.family == AF_INET ? 4 : 16);
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd_, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    return fail(std::string("sock_diag request failed: ") + std::strerror(errno));
  }
  alignas(nlmsghdr) char buf[8192];
  for (int tries = 0; tries < 8; ++tries) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) return fail("sock_diag did not answer");
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(std::string("sock_diag read failed: ") + std::strerror(errno));
    }
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != seq_) continue;  // a late answer to an earlier question
      if (h->nlmsg_type == NLMSG_ERROR) {
        auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
        return fail(std::string("sock_diag: ") + std::strerror(-e->error));
      }
      if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
        auto* d = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
        return SocketInfo{static_cast<uid_t>(d->idiag_uid), d->idiag_state, d->idiag_inode};
      }
    }
  }
  return fail("sock_diag gave no answer for this connection");
}

}  // namespace ddprun::rendezvous
