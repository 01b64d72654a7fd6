#include "workers_store.hpp"

#include "ddprun/common/net.hpp"
#include "ddprun/rendezvous/store_server.hpp"

namespace ddprun::rounds {

std::string advertised_address(const std::string& local_addr, const RoundInfo& info) {
  if (!local_addr.empty()) return local_addr;
  for (std::size_t g = 1; g < info.nodes.size(); ++g) {
    const std::string& theirs = info.nodes[g].reach;
    if (theirs.empty()) continue;
    std::string src = source_address_towards(theirs);
    // A route over loopback only serves members on this host.
    if (!src.empty() && (!is_loopback(src) || is_loopback(theirs))) return src;
  }
  const std::string& mine = info.nodes.empty() ? std::string() : info.nodes[0].reach;
  return mine.empty() ? "127.0.0.1" : mine;
}

WorkersStore::WorkersStore(std::string local_addr, std::size_t reserved_fds)
    : local_addr_(std::move(local_addr)), reserved_fds_(reserved_fds) {}

WorkersStore::~WorkersStore() = default;

StoreAddress WorkersStore::host(const RoundInfo& info) {
  if (!server_) {
    rendezvous::StoreServerOptions so;
    so.host = "";  // every interface: members reach it from theirs
    so.port = 0;
    so.same_user = true;
    so.allow = std::vector<std::string>{};
    so.reserved_fds = reserved_fds_;
    auto server = std::make_shared<rendezvous::StoreServer>(so);
    server->start();
    std::lock_guard<std::mutex> lk(mu_);
    server_ = std::move(server);
  }
  std::vector<std::string> allowed;
  for (const auto& n : info.nodes) {
    for (const auto& a : n.addrs) {
      if (is_ip_literal(a)) allowed.push_back(a);
    }
    if (is_ip_literal(n.reach)) allowed.push_back(n.reach);
    if (is_ip_literal(n.addr)) allowed.push_back(n.addr);
  }
  server_->set_allow(allowed);
  server_->reset();
  StoreAddress a;
  a.host = advertised_address(local_addr_, info);
  a.port = server_->port();
  return a;
}

void WorkersStore::release() {
  std::shared_ptr<rendezvous::StoreServer> gone;
  std::lock_guard<std::mutex> lk(mu_);
  gone = std::move(server_);
}

std::optional<HostedStore> WorkersStore::observe() const {
  std::shared_ptr<rendezvous::StoreServer> s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s = server_;
  }
  if (!s) return std::nullopt;
  return observe_store("workers", *s);
}

HostedStore observe_store(const std::string& role, rendezvous::StoreServer& s) {
  auto t0 = std::chrono::steady_clock::now();
  auto st = s.stats();
  HostedStore h;
  h.role = role;
  h.connections = st.connections;
  h.keys = st.keys;
  h.bytes = st.store_bytes;
  h.loop_latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return h;
}

}  // namespace ddprun::rounds
