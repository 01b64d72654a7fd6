#pragma once
// A real etcd cluster on loopback for tests: N members on free ports, data in a temporary
// directory, started and SIGKILLed by the test, removed at the end.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

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

class EtcdCluster {
 public:
  static bool available() { return std::filesystem::exists(kEtcd); }

  explicit EtcdCluster(int members = 3) {
    char tmpl[] = "/tmp/ddprun-etcd-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::string initial;
    for (int i = 0; i < members; ++i) {
      clients_.push_back(free_port());
      peers_.push_back(free_port());
      initial += (i ? "," : "") + name(i) + "=http://127.0.0.1:" + std::to_string(peers_[i]);
    }
    for (int i = 0; i < members; ++i) pids_.push_back(start(i, initial));
    EtcdClient c({endpoints(), std::chrono::seconds(20)});
    c.put("ddprun-test/ready", "1");  // a quorum is up and has a leader
  }
  ~EtcdCluster() {
    for (auto pid : pids_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::vector<EtcdEndpoint> endpoints() const {
    std::vector<EtcdEndpoint> out;
    for (auto p : clients_) out.push_back({"127.0.0.1", p});
    return out;
  }
  std::string endpoint_list() const {
    std::string out;
    for (auto p : clients_) out += (out.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(p);
    return out;
  }
  // The member that leads, by index.
  int leader() {
    for (std::size_t i = 0; i < clients_.size(); ++i) {
      if (pids_[i] <= 0) continue;
      EtcdClient one({{{"127.0.0.1", clients_[i]}}, std::chrono::seconds(5)});
      auto st = one.status();
      if (st.member_id == st.leader_id) return static_cast<int>(i);
    }
    return -1;
  }
  void kill(int i) {
    ::kill(pids_[i], SIGKILL);
    ::waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }

  pid_t start(int i, const std::string& initial) {
    std::string data = dir_ + "/" + name(i), log = dir_ + "/" + name(i) + ".log";
    std::string client = "http://127.0.0.1:" + std::to_string(clients_[i]);
    std::string peer = "http://127.0.0.1:" + std::to_string(peers_[i]);
    std::vector<std::string> args = {kEtcd, "--name", name(i), "--data-dir", data, "--listen-client-urls", client,
                                     "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                     "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
                                     "--initial-cluster-state", "new", "--heartbeat-interval", "50",
                                     "--election-timeout", "500", "--log-level", "error"};
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

  std::string dir_;
  std::vector<std::uint16_t> clients_, peers_;
  std::vector<pid_t> pids_;
};

}  // namespace ddprun::rounds::testing
