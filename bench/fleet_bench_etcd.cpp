#include "fleet_bench_etcd.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fleet {
namespace {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One HTTP/1.0 request to a member on loopback; the whole answer ("" when it cannot be reached).
std::string http(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string req = method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
                      "\r\n\r\n" + body;
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The value of a metric line "name{labels} value" (labels may be absent).
double value_of(const std::string& line) { return std::stod(line.substr(line.rfind(' ') + 1)); }

std::string label(const std::string& line, const std::string& name) {
  auto at = line.find(name + "=\"");
  if (at == std::string::npos) return "";
  at += name.size() + 2;
  return line.substr(at, line.find('"', at) - at);
}

}  // namespace

Etcd start_etcd(const std::string& bin, const std::string& under) {
  Etcd e;
  std::string tmpl = under + "/fleet_etcd.XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp under " + under);
  e.dir = tmpl;
  std::vector<int> peers;
  for (int i = 0; i < 3; ++i) e.client_ports.push_back(free_port()), peers.push_back(free_port());
  std::string initial;
  for (int i = 0; i < 3; ++i) initial += (i ? "," : "") + ("m" + std::to_string(i)) + "=http://127.0.0.1:" + std::to_string(peers[i]);
  for (int i = 0; i < 3; ++i) {
    const std::string c = "http://127.0.0.1:" + std::to_string(e.client_ports[i]), p = "http://127.0.0.1:" + std::to_string(peers[i]);
    const std::string name = "m" + std::to_string(i), data = e.dir + "/" + name;
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // the bench exits on a failed phase: the members go with it
      const int out = open("/dev/null", O_WRONLY), err = open((e.dir + "/" + name + ".log").c_str(), O_WRONLY | O_CREAT, 0644);
      dup2(out, 1);
      dup2(err, 2);
      execlp(bin.c_str(), bin.c_str(), "--name", name.c_str(), "--data-dir", data.c_str(), "--listen-client-urls", c.c_str(),
             "--advertise-client-urls", c.c_str(), "--listen-peer-urls", p.c_str(), "--initial-advertise-peer-urls", p.c_str(),
             "--initial-cluster", initial.c_str(), "--log-level",
             "error", static_cast<char*>(nullptr));
      _exit(127);
    }
    e.pids.push_back(pid);
    if (i) e.endpoints += ",";
    e.endpoints += "127.0.0.1:" + std::to_string(e.client_ports[i]);
  }
  // {"key": "ready", "value": "1"}, base64.
  for (int t = 0; t < 600; ++t) {
    if (http(e.client_ports[0], "POST", "/v3/kv/put", R"({"key":"cmVhZHk=","value":"MQ=="})").find("\"revision\"") !=
        std::string::npos)
      return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_etcd(e);
  throw std::runtime_error("etcd did not start (" + bin + ")");
}

void stop_etcd(Etcd& e) {
  for (pid_t p : e.pids) kill(p, SIGTERM);
  for (pid_t p : e.pids) waitpid(p, nullptr, 0);
  e.pids.clear();
  std::error_code ec;
  std::filesystem::remove_all(e.dir, ec);
}

Tally etcd_tally(const Etcd& e, std::map<std::string, double>* by_kind) {
  Tally t;
  for (int port : e.client_ports) {
    std::istringstream in(http(port, "GET", "/metrics"));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("grpc_server_msg_received_total{", 0) == 0) {
        const double n = value_of(line);
        const std::string m = label(line, "grpc_method");
        t.requests += n;
        if (m == "LeaseKeepAlive") t.alive += n;
        if (by_kind) (*by_kind)[m] += n;
      } else if (line.rfind("etcd_debugging_mvcc_events_total ", 0) == 0) {
        t.woken += value_of(line);
      } else if (line.rfind("etcd_network_client_grpc_received_bytes_total ", 0) == 0) {
        t.bytes_in += value_of(line);
      } else if (line.rfind("etcd_network_client_grpc_sent_bytes_total ", 0) == 0) {
        t.bytes_out += value_of(line);
      }
    }
  }
  return t;
}

Cpu etcd_cpu(const Etcd& e) {
  Cpu c;
  for (pid_t p : e.pids) {
    Cpu one = cpu_of(p);
    c.run_s += one.run_s, c.ticks_s += one.ticks_s, c.user_s += one.user_s;
  }
  return c;
}

}  // namespace fleet
