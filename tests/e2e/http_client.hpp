#pragma once
// A tiny blocking HTTP/1.1 client for scraping ddprun's metrics endpoint in tests, and raw
// sockets for playing hostile clients against it.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace ddprun::test {

// A connected socket to 127.0.0.1:port, or -1.
inline int connect_local(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends until it closes, or `limit` passes.
inline std::string read_all(int fd, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[16384];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// True when the peer closes the connection, sending nothing, within `limit`; false when it sends
// data or is still open at the end.
inline bool closed_silently(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}

struct HttpReply {
  int status = 0;  // 0: no answer
  std::string body;
};

// `request` sent as is ("GET /metrics HTTP/1.1\r\n..."), the answer parsed.
inline HttpReply http_raw(int port, const std::string& request) {
  HttpReply r;
  int fd = connect_local(port);
  if (fd < 0) return r;
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string all = read_all(fd);
  ::close(fd);
  if (all.rfind("HTTP/1.1 ", 0) == 0) r.status = std::stoi(all.substr(9, 3));
  auto body = all.find("\r\n\r\n");
  if (body != std::string::npos) r.body = all.substr(body + 4);
  return r;
}

inline HttpReply http_get(int port, const std::string& path) {
  return http_raw(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

}  // namespace ddprun::test
