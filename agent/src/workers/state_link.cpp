#include "workers/state_link.hpp"

#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <system_error>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"
#include "ddprun/common/system.hpp"

namespace ddprun::agent {
namespace sl = ddprun::state_layout;
namespace {

constexpr char kMagic[4] = {'D', 'D', 'P', 'S'};
constexpr int kIdleMs = 10000;

[[noreturn]] void link_fail(const std::string& what, int err = 0) {
  throw Error(err ? fmt::format("{}: {}", what, std::strerror(err)) : what);
}

void set_timeouts(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void send_all(int fd, const void* p, std::size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) link_fail("sending", w < 0 ? errno : EPIPE);
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

using Deadline = std::optional<std::chrono::steady_clock::time_point>;

// `deadline`: for the whole of it, not each read (a peer dribbling a byte a second holds no place long).
void recv_all(int fd, void* p, std::size_t n, Deadline deadline = std::nullopt) {
  auto* c = static_cast<unsigned char*>(p);
  while (n > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) link_fail("receiving", ETIMEDOUT);
      set_timeouts(fd, static_cast<int>(left.count()));
    }
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) link_fail("receiving", errno == EAGAIN ? ETIMEDOUT : errno);
    if (r == 0) link_fail("the peer closed the connection");
    c += r;
    n -= static_cast<std::size_t>(r);
  }
}

template <typename T>
void send_value(int fd, T v) {
  send_all(fd, &v, sizeof v);
}
template <typename T>
T recv_value(int fd) {
  T v;
  recv_all(fd, &v, sizeof v);
  return v;
}

std::string recv_string(int fd, std::size_t n, Deadline deadline = std::nullopt) {
  std::string s(n, '\0');
  recv_all(fd, s.data(), n, deadline);
  return s;
}

constexpr std::size_t kNonce = 32, kProof = 32;

// HMAC-SHA256 from OpenSSL's libcrypto, loaded at the first copy: the lean ddprun links no
// OpenSSL (it would cost every launch its load), and only jobs of several nodes copy state.
class Hmac {
 public:
  static const Hmac& get() {
    static const Hmac h;
    return h;
  }
  std::string operator()(const std::string& key, const std::string& message) const {
    if (!hmac_) link_fail(why_);
    unsigned char out[64];
    unsigned int n = 0;
    if (!hmac_(sha256_(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
               message.size(), out, &n) || n != kProof) {
      link_fail("HMAC-SHA256 failed (libcrypto)");
    }
    return std::string(reinterpret_cast<char*>(out), n);
  }

 private:
  using Md = const void* (*)();
  using Fn = unsigned char* (*)(const void*, const void*, int, const unsigned char*, std::size_t, unsigned char*,
                                unsigned int*);
  Hmac() {
    void* lib = ::dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = ::dlopen("libcrypto.so", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      sha256_ = reinterpret_cast<Md>(::dlsym(lib, "EVP_sha256"));
      hmac_ = reinterpret_cast<Fn>(::dlsym(lib, "HMAC"));
    }
    if (!sha256_ || !hmac_) {
      hmac_ = nullptr;
      why_ = "copies of the workers' state across nodes need OpenSSL's libcrypto (apt-get install libssl3), "
             "which was not found";
    }
  }
  Md sha256_ = nullptr;
  Fn hmac_ = nullptr;
  std::string why_;
};

std::string proof(const std::string& key, const char* side, const std::string& a, const std::string& b) {
  return Hmac::get()(key, std::string(side) + a + b);
}

// Constant-time comparison of equal-length strings.
bool same(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// The server's side of the handshake, within `ms` in all; false: the client does not know the key.
bool server_handshake(int fd, std::string key, int ms) {
  const Deadline deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  set_timeouts(fd, ms);
  char magic[4];
  recv_all(fd, magic, 4, deadline);
  if (std::memcmp(magic, kMagic, 4) != 0) return false;
  const std::string cnonce = recv_string(fd, kNonce, deadline);
  const bool none = key.empty();  // no round yet: nobody gets in
  if (none) key = random_bytes(kNonce);
  const std::string snonce = random_bytes(kNonce);
  const std::string challenge = snonce + proof(key, "ddprun-state-server", cnonce, snonce);
  send_all(fd, challenge.data(), challenge.size());
  const std::string theirs = recv_string(fd, kProof, deadline);
  const bool ok = !none && same(theirs, proof(key, "ddprun-state-client", snonce, cnonce));
  send_value<std::uint8_t>(fd, ok ? 0 : 1);
  return ok;
}

void client_handshake(int fd, const std::string& key, const std::string& where) {
  const std::string cnonce = random_bytes(kNonce);
  send_all(fd, kMagic, 4);
  send_all(fd, cnonce.data(), cnonce.size());
  const std::string snonce = recv_string(fd, kNonce);
  const std::string theirs = recv_string(fd, kProof);
  const bool server_ok = same(theirs, proof(key, "ddprun-state-server", cnonce, snonce));
  const std::string mine = server_ok ? proof(key, "ddprun-state-client", snonce, cnonce) : std::string(kProof, '\0');
  send_all(fd, mine.data(), mine.size());
  const auto verdict = recv_value<std::uint8_t>(fd);
  if (!server_ok) link_fail(fmt::format("{} does not know this round's copy key (not an agent of this job?)", where));
  if (verdict != 0) link_fail(fmt::format("{} refused this agent's copy key (another round's?)", where));
}

}  // namespace

std::string derive_key(const std::string& secret, const std::string& label) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : Hmac::get()(secret, "ddprun-state-copies/" + label)) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::optional<sl::SlotHeader> image_header(const unsigned char* data, std::uint64_t bytes) {
  if (bytes < sl::page()) return std::nullopt;
  const auto h = sl::slot_header(data);
  if (!h.committed_within(bytes) || sl::page() + h.payload() != bytes) return std::nullopt;
  return h;
}

// ---- the server ---------------------------------------------------------------------------------

StateLinkServer::StateLinkServer(std::uint64_t budget) : budget_(budget) {}

StateLinkServer::~StateLinkServer() {
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void StateLinkServer::start() {
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = listen_fd_ >= 0;
  if (v6) {
    int off = 0;
    ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(listen_fd_);
      v6 = false;
    }
  }
  if (!v6) {  // no IPv6 on this host
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      link_fail("cannot listen for copies of the workers' state (bind)", errno);
    }
  }
  if (::listen(listen_fd_, 16) != 0) link_fail("cannot listen for copies of the workers' state", errno);
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&s), &len);
  port_ = ntohs(s.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&s)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&s)->sin_port);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) link_fail("cannot listen for copies of the workers' state (eventfd)", errno);
  thread_ = start_thread("the server of the workers' state copies", [this] { run(); });
}

void StateLinkServer::set_key(std::function<std::string()> key) {
  std::lock_guard<std::mutex> lk(mu_);
  key_ = std::move(key);
}

struct StateLinkServer::Connection {
  int fd = -1;
  std::atomic<bool> done{false};
  std::thread thread;
};

void StateLinkServer::run() {
  constexpr std::size_t kMaxConnections = 8;
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    // A second at a time while connections are served (those that ended are reaped), else until
    // one comes: an idle server never wakes.
    if (::poll(fds, 2, connections_.empty() ? -1 : 1000) < 0 && errno != EINTR) break;
    reap(false);
    if (fds[1].revents) break;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (connections_.size() >= kMaxConnections) {  // busy: the client's request fails, and is made again
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    auto* raw = c.get();
    try {
      c->thread = std::thread([this, raw] {
        try {
          serve(raw->fd);
        } catch (const std::exception& e) {
          spdlog::debug("ddprun: a state copy connection: {}", e.what());
        }
        raw->done = true;
      });
    } catch (const std::system_error&) {
      ::close(fd);
      continue;
    }
    connections_.push_back(std::move(c));
  }
  reap(true);
}

void StateLinkServer::reap(bool all) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    auto& c = **it;
    if (all && !c.done) ::shutdown(c.fd, SHUT_RDWR);  // its reads and writes end at once
    if (all || c.done) {
      c.thread.join();
      ::close(c.fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void StateLinkServer::serve(int fd) {
  std::function<std::string()> source;
  {
    std::lock_guard<std::mutex> lk(mu_);
    source = key_;
  }
  if (!source) return;  // before the first round
  const std::string key = source();
  if (!server_handshake(fd, key, 2000)) {  // a client without the key holds no place long
    spdlog::warn("ddprun: refused a connection for the workers' state that did not prove this round's copy key");
    return;
  }
  set_timeouts(fd, kIdleMs);
  const auto op = recv_value<std::uint8_t>(fd);
  const auto rank = recv_value<std::int32_t>(fd);
  const auto bytes = recv_value<std::uint64_t>(fd);
  if (op == 'G') {
    const auto imgs = images(rank);
    send_value<std::uint32_t>(fd, static_cast<std::uint32_t>(imgs.size()));
    for (const auto& img : imgs) {
      send_value<std::uint64_t>(fd, img.bytes);
      send_all(fd, img.data.get(), img.bytes);
    }
    return;
  }
  if (op != 'P') return;
  // Refused before a byte is taken when it cannot be kept; the sender sees the connection end.
  if (bytes < sl::page() || bytes > budget_) {
    spdlog::warn("ddprun: refused a copy of rank {}'s state of {} bytes (this node keeps {} at most)", rank, bytes,
                 budget_);
    return;
  }
  std::shared_ptr<unsigned char[]> data(new unsigned char[bytes]);
  recv_all(fd, data.get(), bytes);
  const bool intact = recv_value<std::uint8_t>(fd) == 1;
  const auto head = image_header(data.get(), bytes);
  bool kept = false;
  if (intact && head) kept = keep(rank, StateImage{head->gen, head->step, bytes, std::move(data), round()});
  send_value<std::uint8_t>(fd, kept ? 0 : 1);
}

bool StateLinkServer::keep(int rank, StateImage image) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& v = held_[rank];
  for (const auto& i : v) {
    if (i.gen == image.gen && i.step == image.step) return true;  // held already
  }
  // Images of older rounds (of any rank) go first where the budget is short: the newest round's
  // are what a loss needs.
  while (held_bytes_ + image.bytes > budget_) {
    StateImage* oldest = nullptr;
    int of = 0;
    for (auto& [r, imgs] : held_) {
      for (auto& i : imgs) {
        if (i.round < image.round && (!oldest || i.round < oldest->round)) {
          oldest = &i;
          of = r;
        }
      }
    }
    if (!oldest) break;
    auto& imgs = held_[of];
    held_bytes_ -= oldest->bytes;
    imgs.erase(imgs.begin() + (oldest - imgs.data()));
    if (imgs.empty() && of != rank) held_.erase(of);
  }
  // The rank's oldest goes to make room: for a third, or where the budget holds fewer.
  while (!v.empty() && (v.size() >= 2 || held_bytes_ + image.bytes > budget_) && v.front().gen < image.gen) {
    held_bytes_ -= v.front().bytes;
    v.erase(v.begin());
  }
  if (v.size() >= 2 || held_bytes_ + image.bytes > budget_) {
    spdlog::warn("ddprun: no room for a copy of rank {}'s state of step {} ({} bytes; {} of {} held)", rank,
                 image.step, image.bytes, held_bytes_, budget_);
    if (v.empty()) held_.erase(rank);
    return false;
  }
  held_bytes_ += image.bytes;
  v.push_back(std::move(image));
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.gen < b.gen; });
  return true;
}

std::vector<StateImage> StateLinkServer::images(int rank) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = held_.find(rank);
  return it == held_.end() ? std::vector<StateImage>{} : it->second;
}

std::vector<int> StateLinkServer::ranks() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> out;
  for (const auto& [r, v] : held_) {
    if (!v.empty()) out.push_back(r);
  }
  return out;
}

void StateLinkServer::drop_before(int round) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    auto& v = it->second;
    for (auto i = v.begin(); i != v.end();) {
      if (i->round < round) {
        held_bytes_ -= i->bytes;
        i = v.erase(i);
      } else {
        ++i;
      }
    }
    it = v.empty() ? held_.erase(it) : std::next(it);
  }
}

std::uint64_t StateLinkServer::held_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_bytes_;
}

// ---- the client ---------------------------------------------------------------------------------

std::pair<std::string, std::uint16_t> StateLinkClient::split_address(const std::string& a) {
  const auto colon = a.rfind(':');
  const auto port = colon == std::string::npos ? std::nullopt : parse_int(std::string_view(a).substr(colon + 1), 1, 65535);
  if (!port || colon == 0) {
    throw Error(fmt::format("a malformed state copy address '{}' (host:port expected)", escape_for_log(a)));
  }
  return {a.substr(0, colon), static_cast<std::uint16_t>(*port)};
}

StateLinkClient::StateLinkClient(const std::string& host, std::uint16_t port, const std::string& key, int timeout_ms)
    : where_(fmt::format("the agent at {}:{}", host, port)) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) link_fail(fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc)));
  int err = 0;
  for (auto* a = res; a && fd_ < 0; a = a->ai_next) {
    fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd_ < 0) continue;
    set_timeouts(fd_, timeout_ms);
    if (::connect(fd_, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      ::close(fd_);
      fd_ = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) link_fail(fmt::format("cannot connect to {}", where_), err);
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  try {
    client_handshake(fd_, key, where_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

StateLinkClient::~StateLinkClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StateLinkClient::send_put(int rank, int fd, std::uint64_t offset, std::uint64_t bytes, std::uint64_t bytes_per_s,
                               const std::atomic<bool>& stop) {
  send_value<std::uint8_t>(fd_, 'P');
  send_value<std::int32_t>(fd_, rank);
  send_value<std::uint64_t>(fd_, bytes);
  // The kernel's copy from the memfd, in slices of at most 4 MB, paced to `bytes_per_s`.
  const auto t0 = std::chrono::steady_clock::now();
  off_t at = static_cast<off_t>(offset);
  std::uint64_t sent = 0;
  while (sent < bytes) {
    if (stop.load()) link_fail("stopped");
    const ssize_t w = ::sendfile(fd_, fd, &at, std::min<std::uint64_t>(bytes - sent, 4u << 20));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) link_fail(fmt::format("sending rank {}'s state to {}", rank, where_), w < 0 ? errno : EPIPE);
    sent += static_cast<std::uint64_t>(w);
    if (bytes_per_s > 0) {
      const auto due = t0 + std::chrono::duration<double>(static_cast<double>(sent) / static_cast<double>(bytes_per_s));
      std::this_thread::sleep_until(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(due));
    }
  }
}

bool StateLinkClient::finish_put(bool intact) {
  send_value<std::uint8_t>(fd_, intact ? 1 : 0);
  return recv_value<std::uint8_t>(fd_) == 0 && intact;
}

std::vector<StateImage> StateLinkClient::get(int rank, std::uint64_t max_bytes) {
  send_value<std::uint8_t>(fd_, 'G');
  send_value<std::int32_t>(fd_, rank);
  send_value<std::uint64_t>(fd_, 0);
  const auto n = recv_value<std::uint32_t>(fd_);
  if (n > 2) link_fail(fmt::format("{} answered {} images of rank {} (2 at most)", where_, n, rank));
  std::vector<StateImage> out;
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto bytes = recv_value<std::uint64_t>(fd_);
    if (bytes < sl::page() || bytes > max_bytes) {
      link_fail(fmt::format("{} offers rank {} an image of {} bytes, over this node's slot of {}", where_, rank, bytes,
                            max_bytes));
    }
    std::shared_ptr<unsigned char[]> data(new unsigned char[bytes]);
    recv_all(fd_, data.get(), bytes);
    const auto head = image_header(data.get(), bytes);
    if (!head) link_fail(fmt::format("{} sent rank {} an image that is not a committed state", where_, rank));
    out.push_back(StateImage{head->gen, head->step, bytes, std::move(data), 0});
  }
  return out;
}

}  // namespace ddprun::agent
