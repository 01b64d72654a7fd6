#include "admission.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "ddprun/rendezvous/auth.hpp"

namespace ddprun::rendezvous {

Admission::Admission(ServerContext& ctx) : ctx_(ctx), my_uid_(::getuid()) {}

const std::vector<IpAddress>& Admission::local_addrs() {
  // Asked of the kernel (a netlink dump) at the first peer that needs it, not at every launch:
  // most stores only ever see loopback clients.
  if (!local_addrs_) local_addrs_ = local_addresses();
  return *local_addrs_;
}

void Admission::set_allow(const std::optional<std::vector<std::string>>& cidrs) {
  if (!cidrs) {
    allow_.reset();
    return;
  }
  std::vector<Cidr> out;
  for (const auto& i : *cidrs) {
    auto part = parse_cidr_list(i);
    out.insert(out.end(), part.begin(), part.end());
  }
  allow_ = std::move(out);
}

void Admission::refuse_for_capacity(const std::string& why) {
  ++ctx_.refused;
  ctx_.refused_log.note(why);
}

bool Admission::admit(int fd, const sockaddr_storage& addr, std::size_t fd_limit) {
  if (!admit_peer(fd, addr)) return false;
  const auto& o = ctx_.options;
  std::string full;
  if (ctx_.connections.size() >= o.max_connections) {
    full = std::to_string(ctx_.connections.size()) + " clients are connected, the limit of --max_connections";
  } else if (static_cast<std::size_t>(fd) + o.reserved_fds >= fd_limit) {
    // Descriptors are allocated lowest first: this one being among the last `reserved_fds`
    // means fewer than that are left for the process that hosts the store.
    full = "only " + std::to_string(fd_limit - static_cast<std::size_t>(fd)) +
           " descriptors are left under the open-file limit of " + std::to_string(fd_limit) + ", and " +
           std::to_string(o.reserved_fds) + " are kept for the hosting process (raise ulimit -n)";
  }
  if (full.empty()) return true;
  // The oldest connection still authenticating makes room: members authenticate at once, so
  // only idle clients without the secret age there.
  if (auto* oldest = ctx_.handshakes.oldest()) {
    oldest->evict();
    ctx_.evicted_log.note("still authenticating, the oldest, to make room for a newcomer: " + full);
    return true;
  }
  turn_away(fd);
  refuse_for_capacity(full);
  return false;
}

// A client turned away for capacity is told so when it speaks ddprun's handshake (a store with a
// secret): the busy marker where the server's challenge would start, then our FIN, so that it
// retries rather than report a refusal. PyTorch's clients retry on a plain close, and a marker
// would read to them as a wrong PING answer: a store without a secret just closes.
void Admission::turn_away(int fd) {
  if (!ctx_.options.secret.empty()) {
    std::uint32_t marker = auth::kBusyMarker;
    ::send(fd, &marker, sizeof(marker), MSG_DONTWAIT | MSG_NOSIGNAL);
    char sink[4096];
    for (int i = 0; i < 4 && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
    }
    ::shutdown(fd, SHUT_WR);
  }
  ::close(fd);
}

// Access control; false (and the connection closed) when the peer may not connect.
bool Admission::admit_peer(int fd, const sockaddr_storage& addr) {
  auto peer = IpAddress::from_sockaddr(addr);
  if (!peer) return true;  // not IP (cannot happen on a TCP listener)
  sockaddr_storage mine{};
  socklen_t len = sizeof(mine);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len);
  auto local = IpAddress::from_sockaddr(mine);
  bool same_host = peer->is_loopback() || (local && peer->same_host_as(*local));
  if (!same_host) {
    for (const auto& a : local_addrs()) same_host = same_host || peer->same_host_as(a);
  }
  auto refuse = [&](const std::string& why) {
    ++ctx_.refused;
    ctx_.log_once(peer->to_string() + "|" + why, "store: refused a connection from " + peer->to_string() + ": " + why);
    ::close(fd);
    return false;
  };
  if (!same_host && allow_) {
    bool ok = false;
    for (const auto& c : *allow_) ok = ok || c.contains(*peer);
    if (!ok) {
      std::string list;
      for (const auto& c : *allow_) list += (list.empty() ? "" : ",") + c.to_string();
      return refuse("not in the allowed addresses (" + (list.empty() ? std::string("none") : list) + ")");
    }
  }
  if (same_host && ctx_.options.same_user && local) {
    std::string error;
    auto info = owners_.lookup(*peer, *local, &error);
    if (!info) return refuse("cannot tell which user owns the connecting socket (" + error + ")");
    // A client that closed before we got here cannot be told from root (a time-wait socket is
    // reported as uid 0): its requests are never served.
    if (!info->owner_known()) {
      return refuse("the connecting socket was closed before the store could check its owner (it is " +
                    info->state_name() + (info->inode == 0 ? ", held by no process" : "") +
                    "); its requests are not served");
    }
    if (info->uid != my_uid_ && info->uid != 0) {
      return refuse("the connecting process belongs to uid " + std::to_string(info->uid) + "; only uid " +
                    std::to_string(my_uid_) + " (this job's user) and root may connect");
    }
  }
  return true;
}

void Admission::configure(int fd) const {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // The kernel takes at most this much beyond what the peer's window lets it send. Without it,
  // a send buffer grows towards net.ipv4.tcp_wmem's maximum (4 MiB) for a client that never
  // reads: 200 such watchers of one key would hold up to 800 MiB of socket buffers, each byte
  // copied there by the store's one thread while everyone else waits.
  int unsent = static_cast<int>(kMaxUnsentInKernel);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &unsent, sizeof(unsent));
  int idle = static_cast<int>(ctx_.options.tcp_keepalive_idle.count());
  if (idle <= 0) return;
  int interval = std::max(1, idle / 3), count = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

}  // namespace ddprun::rendezvous
