#pragma once
// A real etcd cluster on loopback for tests: N members on free ports, data in a temporary
// directory, started, SIGKILLed, paused (SIGSTOP) and restarted by the test, removed at the end.
// Plain HTTP, or TLS-only (client and peer URLs https://, optionally requiring client
// certificates).

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/http_client.hpp"
#include "etcd_client.hpp"

namespace ddprun::rounds::testing {

inline const char* kEtcd = "/usr/bin/etcd";

inline std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// True once something accepts connections on 127.0.0.1:port, false at the deadline.
inline bool listening(std::uint16_t port, std::chrono::steady_clock::time_point deadline) {
  for (auto backoff = std::chrono::milliseconds(10); std::chrono::steady_clock::now() < deadline;) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(backoff);  // retry backoff: etcd is starting
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  return false;
}

// The members' TLS: their certificate and key (for clients and peers) and the CA they trust.
struct EtcdServerTls {
  std::string cert, key, ca;
  bool client_cert_auth = false;  // clients must present a certificate signed by `ca`
  bool enabled() const { return !cert.empty(); }
};

// This process's established TCP connections to 127.0.0.1:port, by local address (its sockets,
// found in /proc/net/tcp by inode); their descriptors into `fds` when given.
inline std::set<std::string> connections_to(std::uint16_t port, std::vector<int>* fds = nullptr) {
  std::set<std::string> found;
  std::map<std::string, int> mine;  // socket inode -> descriptor
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      mine[target.substr(8, target.size() - 9)] = std::stoi(fd.path().filename().string());
    }
  }
  std::ifstream tcp("/proc/self/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state != "01" || !mine.count(inode)) continue;
    if (std::stoul(remote.substr(remote.find(':') + 1), nullptr, 16) == port) {
      found.insert(local);
      if (fds) fds->push_back(mine[inode]);
    }
  }
  return found;
}
inline bool connected_to(std::uint16_t port) { return !connections_to(port).empty(); }

class EtcdCluster {
 public:
  static bool available() { return std::filesystem::exists(kEtcd); }

  // How the constructor knows the cluster is up: a write through the client (a quorum with a
  // leader), or only the client ports accepting (a member whose certificate no client accepts).
  enum class Ready { written, listening };

  explicit EtcdCluster(int members = 3, EtcdServerTls tls = {}, Ready ready = Ready::written) : tls_(std::move(tls)) {
    char tmpl[] = "/tmp/ddprun-etcd-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::string initial;
    for (int i = 0; i < members; ++i) {
      clients_.push_back(free_port());
      peers_.push_back(free_port());
      initial += (i ? "," : "") + name(i) + "=" + scheme() + "127.0.0.1:" + std::to_string(peers_[i]);
    }
    initial_ = initial;
    for (int i = 0; i < members; ++i) pids_.push_back(start(i));
    if (ready == Ready::listening) {
      for (auto p : clients_) listening(p, std::chrono::steady_clock::now() + std::chrono::seconds(20));
      return;
    }
    EtcdOptions o(endpoints(), std::chrono::seconds(20));
    o.tls = client_tls();
    EtcdClient c(o);
    c.put("ddprun-test/ready", "1");  // a quorum is up and has a leader
  }
  ~EtcdCluster() {
    for (auto pid : pids_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::kill(pid, SIGCONT);
        ::waitpid(pid, nullptr, 0);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::vector<EtcdEndpoint> endpoints() const {
    std::vector<EtcdEndpoint> out;
    for (auto p : clients_) out.push_back({"127.0.0.1", p, tls_.enabled()});
    return out;
  }
  // "127.0.0.1:P,..." (TLS: "https://127.0.0.1:P,...").
  std::string endpoint_list() const {
    std::string out;
    for (auto p : clients_) {
      out += (out.empty() ? "" : ",") + std::string(tls_.enabled() ? "https://" : "") + "127.0.0.1:" + std::to_string(p);
    }
    return out;
  }
  std::uint16_t client_port(int i) const { return clients_.at(static_cast<std::size_t>(i)); }
  // What a client that the members accept uses: their CA, and (when they require one) their own
  // certificate as the client's.
  EtcdTls client_tls() const {
    if (!tls_.enabled()) return {};
    if (!tls_.client_cert_auth) return {tls_.ca, "", ""};
    return {tls_.ca, tls_.cert, tls_.key};
  }
  // The member that leads, by index.
  int leader() {
    for (std::size_t i = 0; i < clients_.size(); ++i) {
      if (pids_[i] <= 0) continue;
      EtcdOptions o({{"127.0.0.1", clients_[i], tls_.enabled()}}, std::chrono::seconds(5));
      o.tls = client_tls();
      EtcdClient one(o);
      auto st = one.status();
      if (st.member_id == st.leader_id) return static_cast<int>(i);
    }
    return -1;
  }
  void kill(int i) {
    ::kill(pids_[i], SIGKILL);
    ::kill(pids_[i], SIGCONT);
    ::waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
  }
  // SIGSTOP: the member's sockets stay open and its kernel accepts connections, but it answers
  // nothing (a disk stall, a long GC pause).
  // Returns once every thread of the member is stopped: kill() returns before that, and a thread
  // running on the other core (a loaded machine) could still answer a request sent meanwhile.
  void pause(int i) {
    ::kill(pids_[i], SIGSTOP);
    for (int t = 0; t < 2000 && !stopped(pids_[i]); ++t) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void resume(int i) { ::kill(pids_[i], SIGCONT); }
  static bool stopped(pid_t pid) {
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      std::ifstream in(task.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto close = stat.rfind(") ");
      if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'T' && stat[close + 2] != 't') return false;
    }
    return !ec;
  }
  // The requests the members received (gRPC messages, the JSON gateway's included) by method
  // ("Range", "Watch", "LeaseKeepAlive", ...), summed over the members (their /metrics).
  std::map<std::string, double> requests() const {
    std::map<std::string, double> by;
    for (auto port : clients_) {
      // HTTP/1.0: the answer ends with the connection, and is not chunked (etcd's is, to 1.1).
      std::istringstream in(ddprun::test::http_raw(port, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").body);
      const std::string head = "grpc_server_msg_received_total{";
      for (std::string line; std::getline(in, line);) {
        if (line.rfind(head, 0) != 0) continue;
        auto at = line.find("grpc_method=\"");
        if (at == std::string::npos) continue;
        at += 13;
        by[line.substr(at, line.find('"', at) - at)] += std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return by;
  }
  // Compacts the history up to `revision` (etcdctl compact): a watch from before it is cancelled.
  bool compact(std::int64_t revision) const {
    const std::string cmd = "ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:" + std::to_string(clients_.at(0)) +
                            " compact " + std::to_string(revision) + " >/dev/null";
    return !tls_.enabled() && std::system(cmd.c_str()) == 0;
  }
  // Starts a member that was killed again, on its data; true once its client port accepts.
  bool restart(int i) {
    pids_[i] = start(i);
    return listening(clients_[i], std::chrono::steady_clock::now() + std::chrono::seconds(20));
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }
  std::string scheme() const { return tls_.enabled() ? "https://" : "http://"; }

  std::vector<std::string> tls_args() const {
    if (!tls_.enabled()) return {};
    std::vector<std::string> a = {"--cert-file", tls_.cert, "--key-file", tls_.key, "--trusted-ca-file", tls_.ca,
                                  "--peer-cert-file", tls_.cert, "--peer-key-file", tls_.key,
                                  "--peer-trusted-ca-file", tls_.ca, "--peer-client-cert-auth"};
    if (tls_.client_cert_auth) a.push_back("--client-cert-auth");
    return a;
  }

  pid_t start(int i) {
    const std::string& initial = initial_;
    std::string data = dir_ + "/" + name(i), log = dir_ + "/" + name(i) + ".log";
    std::string client = scheme() + "127.0.0.1:" + std::to_string(clients_[i]);
    std::string peer = scheme() + "127.0.0.1:" + std::to_string(peers_[i]);
    std::vector<std::string> args = {kEtcd, "--name", name(i), "--data-dir", data, "--listen-client-urls", client,
                                     "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                     "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
                                     "--initial-cluster-state", "new", "--heartbeat-interval", "50",
                                     "--election-timeout", "500", "--log-level", "error"};
    for (auto& a : tls_args()) args.push_back(a);
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kEtcd, argv.data());
      ::_exit(127);
    }
    return pid;
  }

  EtcdServerTls tls_;
  std::string dir_, initial_;
  std::vector<std::uint16_t> clients_, peers_;
  std::vector<pid_t> pids_;
};

}  // namespace ddprun::rounds::testing
