// The etcd v3 client (through the JSON gateway) against a real 3-member etcd cluster on loopback.
// Skipped, with a message, where etcd is not installed (scripts/setup.sh installs etcd-server).
#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <fstream>
#include <filesystem>
#include <thread>

#include "ddprun/common/error.hpp"
#include "etcd_cluster.hpp"
#include "etcd_transport.hpp"
#include "loopback.hpp"
#include "skip.hpp"

using namespace ddprun::rounds;
using namespace ddprun::rounds::testing;
using namespace std::chrono_literals;

#define SKIP_WITHOUT_ETCD() SKIP_UNLESS(EtcdCluster::available(), "etcd is not installed (scripts/setup.sh installs etcd-server)")

TEST_CASE("etcd: endpoints are parsed with clear errors", "[etcd]") {
  auto e = parse_etcd_endpoints("h1:2379, h2:23790,[::1]:1,http://h4");
  REQUIRE(e.size() == 4);
  CHECK(e[1].port == 23790);
  CHECK(e[2].host == "::1");
  CHECK(e[3].port == 2379);
  CHECK_THROWS_WITH(parse_etcd_endpoints("h1:99999"), Catch::Contains("1-65535"));
  CHECK_THROWS_WITH(parse_etcd_endpoints(" , "), Catch::Contains("no etcd endpoint"));
}

TEST_CASE("etcd: nothing listening is a clear error naming every endpoint, within the time-out", "[etcd]") {
  auto a = free_port(), b = free_port();
  EtcdClient c({{{"127.0.0.1", a}, {"127.0.0.1", b}}, 500ms});
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(c.get("x"), Catch::Contains("cannot reach etcd at 127.0.0.1:" + std::to_string(a) +
                                                ", 127.0.0.1:" + std::to_string(b)));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}

TEST_CASE("etcd: keys, prefixes in creation order, create-if-absent, deletion", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  EtcdClient c({cluster.endpoints(), 5s});
  c.put("/ddprun/t/b", "2");
  c.put("/ddprun/t/a", "1");
  c.put("/ddprun/t0", "outside");
  auto got = c.get("/ddprun/t/a");
  REQUIRE(got);
  CHECK(got->value == "1");
  CHECK_FALSE(c.get("/ddprun/t/none"));
  auto all = c.get_prefix("/ddprun/t/");
  REQUIRE(all.size() == 2);
  CHECK(all[0].key == "/ddprun/t/b");  // created first
  std::string binary("\0\xff{}\n", 5);
  c.put("/ddprun/t/bin", binary);
  CHECK(c.get("/ddprun/t/bin")->value == binary);
  EtcdKv existing;
  CHECK(c.create("/ddprun/t/closed", "first", 0, &existing));
  CHECK_FALSE(c.create("/ddprun/t/closed", "second", 0, &existing));
  CHECK(existing.value == "first");
  // Many keys at once: transactions of up to EtcdClient::kTxnPuts puts.
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("/ddprun/t/many/" + std::to_string(i));
    values.push_back("v" + std::to_string(i));
  }
  c.put_all(keys, values);
  auto many = c.get_prefix("/ddprun/t/many/");
  REQUIRE(many.size() == 300);
  for (const auto& kv : many) CHECK(kv.value == "v" + kv.key.substr(kv.key.rfind('/') + 1));
  CHECK(c.delete_prefix("/ddprun/t/") == 304);
  CHECK(c.get_prefix("/ddprun/t/").empty());
  CHECK(c.get("/ddprun/t0")->value == "outside");
}

TEST_CASE("etcd: a key on a lease vanishes when the lease is not kept alive - and stays while it is", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  EtcdClient c({cluster.endpoints(), 5s});
  auto kept = c.grant_lease(1s), dropped = c.grant_lease(1s);
  c.put("/l/kept", "x", kept);
  auto rev = c.put("/l/dropped", "x", dropped);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<EtcdEvent> ev;
  while (ev.empty() && std::chrono::steady_clock::now() - t0 < 5s) {
    CHECK(c.keep_alive(kept));
    ev = c.watch("/l/dropped", false, rev + 1, 300ms);
  }
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].deleted);  // the lease expired: no polling, the watch says so
  CHECK(std::chrono::steady_clock::now() - t0 < 4s);
  CHECK(c.get("/l/kept"));
  CHECK_FALSE(c.keep_alive(dropped));
  c.revoke(kept);
  CHECK_FALSE(c.get("/l/kept"));
}

TEST_CASE("etcd: a watch wakes on the next change, and times out without one", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  EtcdClient c({cluster.endpoints(), 5s}), writer({cluster.endpoints(), 5s});
  auto rev = c.put("/w/x", "0");
  CHECK(c.watch("/w/", true, rev + 1, 200ms).empty());
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer.put("/w/y", "1");
  });
  auto ev = c.watch("/w/", true, rev + 1, 5s);
  t.join();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kv.key == "/w/y");
  CHECK(ev[0].kv.value == "1");
  // From an old revision: what already happened.
  CHECK(c.watch("/w/x", false, rev, 1s).size() == 1);
}

TEST_CASE("etcd: a watch held to its limit is quiet - not one with an event or a cancel - and an interrupt ends it at once", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  EtcdClient c({cluster.endpoints(), 5s}), writer({cluster.endpoints(), 5s});
  auto rev = writer.put("/q/x", "0");
  bool quiet = false;
  CHECK(c.watch("/q/x", false, rev + 1, 1s, &quiet).empty());
  CHECK(quiet);  // watched again from rev + 1, nothing can be missed: no read needed
  CHECK(c.watch("/q/x", false, rev, 1s, &quiet).size() == 1);
  CHECK_FALSE(quiet);
  // A compacted revision: etcd cancels the watch at once; not quiet, so the caller reads anew.
  auto later = writer.put("/q/x", "1");
  writer.put("/q/x", "2");
  REQUIRE(cluster.compact(later + 1));
  auto t0 = std::chrono::steady_clock::now();
  CHECK(c.watch("/q/x", false, rev, 5s, &quiet).empty());
  CHECK_FALSE(quiet);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  // interrupt() from another thread ends a long watch within moments, and every later one.
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    c.interrupt();
  });
  t0 = std::chrono::steady_clock::now();
  CHECK(c.watch("/q/x", false, later + 2, 30s, &quiet).empty());
  t.join();
  CHECK_FALSE(quiet);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  t0 = std::chrono::steady_clock::now();
  CHECK(c.watch("/q/x", false, later + 2, 30s, &quiet).empty());
  CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
}

TEST_CASE("etcd: kill -9 of the leader - the client carries on with the other members", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  EtcdClient c({cluster.endpoints(), 10s});
  c.put("/k/before", "1");
  int leader = cluster.leader();
  REQUIRE(leader >= 0);
  cluster.kill(leader);
  auto t0 = std::chrono::steady_clock::now();
  c.put("/k/after", "2");  // a new leader is elected (election timeout 0.5 s here)
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(c.get("/k/before")->value == "1");
  CHECK(c.get("/k/after")->value == "2");
  CHECK(cluster.leader() != leader);
}

TEST_CASE("etcd: requests share one connection to a member - one the member closed since is replaced before sending", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  // A member that does not lead (killing the leader would start an election), and the third.
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  const int m = leader == 0 ? 1 : 0, other = 3 - m - leader;
  const auto port = cluster.client_port(m), other_port = cluster.client_port(other);
  EtcdClient c({{{"127.0.0.1", port}, {"127.0.0.1", other_port}}, 10s});
  c.put("/k/0", "v");
  const auto first = connections_to(port);
  CHECK(first.size() == 1);
  for (int i = 1; i < 20; ++i) c.put("/k/" + std::to_string(i), "v");
  CHECK(c.get_prefix("/k/").size() == 20);
  std::vector<int> fds;
  CHECK(connections_to(port, &fds) == first);  // the 21 requests went over the first one's connection
  REQUIRE(fds.size() == 1);
  CHECK((::fcntl(fds[0], F_GETFD) & FD_CLOEXEC) != 0);  // kept open, but not inherited by programs run meanwhile
  // The member restarted: its kept connection is closed. The next request sees that before it
  // sends anything and takes a new connection to the same member; sent on the old one, it would
  // have failed and gone to the other member.
  cluster.kill(m);
  REQUIRE(cluster.restart(m));
  EtcdClient probe({{{"127.0.0.1", port}}, 10s});
  REQUIRE(probe.get("/k/3"));  // the restarted member serves (on a connection of the probe's own)
  CHECK(c.get("/k/3")->value == "v");
  CHECK(connections_to(port).size() == 2);  // the client's new one and the probe's
  CHECK(connections_to(port) != first);
  CHECK(connections_to(other_port).empty());
}

TEST_CASE("etcd: a cluster with authentication on - the right user is served, a wrong one is refused clearly", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/etcdctl"), "etcdctl is not installed (scripts/setup.sh installs etcd-client)");
  EtcdCluster cluster(1);
  std::string ctl = "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=" + cluster.endpoint_list();
  REQUIRE(std::system((ctl + " user add root:s3cret >/dev/null 2>&1").c_str()) == 0);
  REQUIRE(std::system((ctl + " auth enable >/dev/null 2>&1").c_str()) == 0);
  EtcdOptions good(cluster.endpoints(), 5s);
  good.user = "root";
  good.password = "s3cret";
  EtcdClient c(good);
  c.put("/a/x", "1");
  CHECK(c.get("/a/x")->value == "1");
  EtcdOptions bad = good;
  bad.password = "guess";
  EtcdClient wrong(bad);
  CHECK_THROWS_AS(wrong.get("/a/x"), ddprun::AuthError);
  CHECK_THROWS_WITH(wrong.get("/a/x"), Catch::Contains("refused ddprun"));
  EtcdClient anonymous({cluster.endpoints(), 5s});
  CHECK_THROWS_AS(anonymous.get("/a/x"), ddprun::AuthError);
}

namespace {

// A broken or hostile "etcd": every request gets a body that never ends ('{' forever, chunked).
class EndlessServer {
 public:
  EndlessServer() {
    fd_ = ddprun::test::listen_loopback(port_);
    REQUIRE(fd_ >= 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~EndlessServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::uint16_t port() const { return port_; }

 private:
  void serve() {
    for (;;) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      ::recv(c, buf, sizeof(buf), 0);  // the request (small): not parsed
      std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
      std::string chunk = "4000\r\n" + std::string(0x4000, '{') + "\r\n";
      bool ok = ::send(c, head.data(), head.size(), MSG_NOSIGNAL) > 0;
      while (ok) ok = ::send(c, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0;
      ::close(c);
    }
  }
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// An overloaded "etcd" member: it reads each request, counts it, and answers it `delay` later on
// the same connection, as a member behind with its work does.
class SlowMember {
 public:
  explicit SlowMember(std::chrono::milliseconds delay) : delay_(delay) {
    fd_ = ddprun::test::listen_loopback(port_);
    REQUIRE(fd_ >= 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~SlowMember() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (int c : conns_) ::shutdown(c, SHUT_RDWR);
    }
    for (auto& t : served_) t.join();
    for (int c : conns_) ::close(c);
  }
  std::uint16_t port() const { return port_; }
  int requests() const { return requests_; }

 private:
  void serve() {
    for (;;) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::lock_guard<std::mutex> lk(mu_);
      conns_.push_back(c);
      served_.emplace_back([this, c] { answer(c); });
    }
  }
  void answer(int c) {
    std::string in;
    char buf[4096];
    for (;;) {
      auto head_end = in.find("\r\n\r\n");
      auto length_at = in.find("Content-Length: ");
      if (head_end != std::string::npos && length_at != std::string::npos &&
          in.size() >= head_end + 4 + std::stoul(in.substr(length_at + 16))) {
        in.clear();  // one request (the client sends one at a time on a connection)
        ++requests_;
        std::this_thread::sleep_for(delay_);
        const std::string body = R"({"header":{"revision":"7"}})";
        const std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body;
        if (::send(c, answer.data(), answer.size(), MSG_NOSIGNAL) <= 0) return;
        continue;
      }
      auto n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) return;
      in.append(buf, static_cast<std::size_t>(n));
    }
  }
  std::chrono::milliseconds delay_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<int> requests_{0};
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> served_;
  std::thread thread_;
};

long rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("VmRSS:", 0) == 0) return std::stol(l.substr(6));
  }
  return 0;
}

}  // namespace

TEST_CASE("etcd: a server whose answer never ends - bounded memory and time, a clear error", "[etcd]") {
  EndlessServer server;
  EtcdClient c({{{"127.0.0.1", server.port()}}, 2s});
  long before = rss_kib();
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(c.watch("/x", true, 1, 5s), Catch::Contains("sent a watch message of over"));
  CHECK(std::chrono::steady_clock::now() - t0 < 4s);
  CHECK_THROWS_WITH(c.get("/x"), Catch::Contains("cannot reach etcd at 127.0.0.1:" + std::to_string(server.port())));
  CHECK(std::chrono::steady_clock::now() - t0 < 8s);
  CHECK(rss_kib() - before < 64 * 1024);
}

TEST_CASE("etcd: an answer that arrived while the client's thread was kept off the CPU past its deadline counts",
          "[etcd]") {
  // A member that answers the moment this client is waiting for it.
  std::uint16_t port = 0;
  const int fd = ddprun::test::listen_loopback(port, 1);
  REQUIRE(fd >= 0);
  int c = -1;
  std::thread member([&] { c = ::accept(fd, nullptr, nullptr); });
  boost::asio::io_context io;
  auto stream = EtcdStream::open(io, EtcdEndpoint{"127.0.0.1", port}, nullptr, EtcdStream::Clock::now() + 5s);
  member.join();
  REQUIRE(c >= 0);
  boost::beast::flat_buffer buf;
  EtcdStream::Response res;
  boost::system::error_code ec = boost::asio::error::would_block;
  stream.async_read(buf, res, [&](boost::system::error_code r, std::size_t) { ec = r; });
  // The answer is sent, and is in this side's socket once the member's side holds nothing unacknowledged.
  const std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
  REQUIRE(::send(c, answer.data(), answer.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(answer.size()));
  int unacked = 1;
  for (int i = 0; i < 1000 && unacked > 0; ++i) {
    ::ioctl(c, SIOCOUTQ, &unacked);
    if (unacked > 0) std::this_thread::sleep_for(1ms);
  }
  REQUIRE(unacked == 0);
  // This thread runs again only after its deadline, as on a node whose cores are busy.
  CHECK(stream.run(io, EtcdStream::Clock::now() - 1ms));
  CHECK_FALSE(ec);
  CHECK(res.body() == "{}");
  ::close(c);
  ::close(fd);
}

TEST_CASE("etcd: a cluster slower than every member's share still answers within the call's time - each member asked once, the first answer counts",
          "[etcd]") {
  // Every member answers 1.2 s after a request; a member's share is 300 ms at first and at most
  // 1 s (a third of the call's 3 s). Giving up on a request after its share and sending it
  // again would never see an answer, and would add to the work the cluster is behind with.
  SlowMember a(1200ms), b(1200ms), c(1200ms);
  EtcdOptions o({{"127.0.0.1", a.port()}, {"127.0.0.1", b.port()}, {"127.0.0.1", c.port()}}, 3s);
  o.attempt = 300ms;
  EtcdClient client(o);
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(client.get("/slow"));
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(client.revision() == 7);
  CHECK(took >= 1200ms);
  CHECK(took < 2s);  // the first member's answer, not the third's (1.2 s after 600 ms)
  CHECK(a.requests() == 1);
  CHECK(b.requests() == 1);  // asked 300 ms in
  CHECK(c.requests() == 1);  // and 600 ms in
  CHECK(client.last_sent() - t0 < 100ms);  // the answer counted is to the request sent first
}

TEST_CASE("etcd: a slow member's request is waited for while the others refuse - they are asked again, it is not", "[etcd]") {
  SlowMember slow(1200ms);
  const auto gone1 = free_port(), gone2 = free_port();
  EtcdOptions o({{"127.0.0.1", slow.port()}, {"127.0.0.1", gone1}, {"127.0.0.1", gone2}}, 3s);
  o.attempt = 300ms;
  EtcdClient client(o);
  CHECK_FALSE(client.get("/slow"));
  CHECK(slow.requests() == 1);
  // Too slow for the call's time: said to be unanswered (slow), not refused; with a member that
  // refused among them, it is not.
  EtcdClient hurried({{{"127.0.0.1", slow.port()}}, 500ms});
  CHECK_THROWS_AS(hurried.get("/slow"), ddprun::UnansweredError);
  EtcdClient mixed({{{"127.0.0.1", slow.port()}, {"127.0.0.1", gone1}}, 500ms});
  try {
    mixed.get("/slow");
    FAIL("answered");
  } catch (const ddprun::UnansweredError&) {
    FAIL("a refusal counted as unanswered");
  } catch (const ddprun::NetworkError& e) {
    CHECK_THAT(e.what(), Catch::Contains("no answer from 127.0.0.1:" + std::to_string(slow.port()) + " in time"));
  }
}
