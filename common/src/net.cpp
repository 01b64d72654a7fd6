#include "ddprun/common/net.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>

namespace ddprun {
namespace {

std::string numeric(const sockaddr* sa, socklen_t len) {
  char buf[NI_MAXHOST];
  if (::getnameinfo(sa, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  std::string a = buf;
  return a.substr(0, a.find('%'));  // drop an IPv6 scope
}

socklen_t length_of(const sockaddr* sa) {
  return sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

}  // namespace

std::vector<std::string> local_addresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (auto* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    std::string a = numeric(i->ifa_addr, length_of(i->ifa_addr));
    if (!a.empty()) out.push_back(a);
  }
  ::freeifaddrs(ifs);
  return out;
}

std::vector<std::string> resolve_host(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (auto* ai = res; ai; ai = ai->ai_next) {
    std::string a = numeric(ai->ai_addr, ai->ai_addrlen);
    if (!a.empty()) out.push_back(a);
  }
  ::freeaddrinfo(res);
  return out;
}

bool is_ip_literal(const std::string& address) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, address.c_str(), buf) == 1 || ::inet_pton(AF_INET6, address.c_str(), buf) == 1;
}

std::string host_name_problem(const std::string& host) {
  if (is_ip_literal(host)) return "";
  // A link-local IPv6 address with its zone (fe80::1%eth0), which getaddrinfo takes.
  if (const auto pct = host.find('%'); pct != std::string::npos && pct + 1 < host.size() &&
      is_ip_literal(host.substr(0, pct)) && host.find_first_of("/ \t%", pct + 1) == std::string::npos) {
    return "";
  }
  std::string name = host;
  if (!name.empty() && name.back() == '.') name.pop_back();  // the root's dot: not counted
  if (name.empty()) return "the host name is empty";
  if (name.size() > 253) return "the host name has " + std::to_string(name.size()) + " characters, over DNS's 253";
  for (char c : name) {  // a name's letters, digits, '-', '.' (and '_', which some sites use)
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '-' && c != '.' && c != '_') {
      char shown[8];
      std::snprintf(shown, sizeof(shown), std::isprint(u) ? "'%c'" : "\\x%02x", u);
      return std::string("the host name holds ") + shown + ", which no host name or IP address has";
    }
  }
  // Digits and dots only: an IPv4 address in one of the forms getaddrinfo takes (127.1 too), or
  // nothing that can ever resolve (a name's last label is never all digits).
  in_addr v4{};
  if (name.find('.') != std::string::npos && name.find_first_not_of("0123456789.") == std::string::npos &&
      ::inet_aton(host.c_str(), &v4) == 0) {  // (with a root dot, getaddrinfo asks DNS)
    return "not an IPv4 address (four numbers from 0 to 255), and no host name is all digits";
  }
  std::size_t start = 0;
  for (;;) {
    std::size_t dot = name.find('.', start);
    std::size_t len = (dot == std::string::npos ? name.size() : dot) - start;
    if (len == 0) return "the host name has an empty label (two dots, or a dot first)";
    if (len > 63) return "a label of the host name has " + std::to_string(len) + " characters, over DNS's 63";
    if (dot == std::string::npos) return "";
    start = dot + 1;
  }
}

bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address.rfind("::ffff:127.", 0) == 0;
}

std::string source_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0) return "";
  std::string out;
  for (auto* ai = res; ai && out.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    // connect() on a UDP socket only picks the route and the source address.
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      out = numeric(reinterpret_cast<sockaddr*>(&local), len);
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

std::string bound_address(int fd) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return "";
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return "";
  return numeric(reinterpret_cast<sockaddr*>(&local), len);
}

}  // namespace ddprun
