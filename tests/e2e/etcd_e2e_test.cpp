// The etcd rendezvous backend end to end: agents (the built ddprun) meeting through a real
// 3-member etcd cluster on loopback. Skipped, with a message, where etcd is not installed.
#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <set>

#include "e2e/agents.hpp"
#include "etcd_cluster.hpp"
#include "skip.hpp"
#include "test_pki.hpp"

using namespace ddprun::test;
using ddprun::rounds::EtcdClient;
using ddprun::rounds::testing::EtcdCluster;
using ddprun::rounds::testing::TestPki;

#define SKIP_WITHOUT_ETCD() SKIP_UNLESS(EtcdCluster::available(), "etcd is not installed (scripts/setup.sh installs etcd-server)")

namespace {

std::vector<std::string> agent(const EtcdCluster& c, const std::string& id, const std::string& nnodes,
                               std::vector<std::string> rest,
                               const std::string& conf = "lease_ttl=1,last_call_timeout=1,join_timeout=30") {
  std::vector<std::string> args = {"--nnodes=" + nnodes, "--rdzv_backend=etcd", "--rdzv_endpoint=" + c.endpoint_list(),
                                   "--rdzv_id=" + id, "--rdzv_conf=" + conf};
  args.insert(args.end(), rest.begin(), rest.end());
  return cmd(args);
}

// Waits until `l`'s log has `text` (bounded).
bool logged(Launch& l, const std::string& text, std::chrono::seconds limit = 20s) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    l.wait_for("\x01", 1, 50ms);
    if (l.err().find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("etcd backend: 2 agents x 2 workers form one world - nothing is left in etcd", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  Launch a(agent(cluster, "job1", "2", {"--nproc_per_node=2", kWorker, "env"}));
  Launch b(agent(cluster, "job1", "2", {"--nproc_per_node=2", kWorker, "env"}));
  auto rb = b.finish(60s), ra = a.finish(60s);
  INFO(ra.err << "\n---\n" << rb.err);
  REQUIRE(ra.code == 0);
  REQUIRE(rb.code == 0);
  std::set<std::string> ranks, ports;
  std::regex re(R"(\[default\d\]:(RANK|MASTER_PORT|WORLD_SIZE)=(\d+))");
  for (const auto* out : {&ra.out, &rb.out}) {
    for (auto it = std::sregex_iterator(out->begin(), out->end(), re); it != std::sregex_iterator(); ++it) {
      if ((*it)[1] == "RANK") ranks.insert((*it)[2]);
      if ((*it)[1] == "MASTER_PORT") ports.insert((*it)[2]);
      if ((*it)[1] == "WORLD_SIZE") CHECK((*it)[2] == "4");
    }
  }
  CHECK(ranks == std::set<std::string>{"0", "1", "2", "3"});
  CHECK(ports.size() == 1);
  EtcdClient c({cluster.endpoints(), 5s});
  // A finished job leaves nothing behind but markers on a lease: the run, and no next round.
  auto left = c.get_prefix("/ddprun/job1");
  REQUIRE(left.size() == 2);
  CHECK(left[0].key == "/ddprun/job1.finished");
  CHECK(left[1].key == "/ddprun/job1/r1/rc");
  for (const auto& kv : left) CHECK(kv.lease != 0);
  // A node started late with the same run id is told, instead of waiting for a rendezvous.
  auto late = Launch(agent(cluster, "job1", "2", {"--nproc_per_node=2", kWorker, "env"})).finish(60s);
  CHECK(late.code == 1);
  CHECK_THAT(late.err, Catch::Contains("run id 'job1' already finished"));
}

TEST_CASE("etcd backend: a job at rest costs etcd a few requests a second per node - not one a second per key watched", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  // Default lease (5 s): renewed every 0.5 s. Each node also watches the round's end and the
  // next member's record; a quiet watch is renewed without reading the key again, and the
  // record's watch is held a TTL.
  const std::string conf = "last_call_timeout=1,join_timeout=30";
  Launch a(agent(cluster, "rest", "2", {"--nproc_per_node=1", kWorker, "heartbeat:200:50"}, conf));
  Launch b(agent(cluster, "rest", "2", {"--nproc_per_node=1", kWorker, "heartbeat:200:50"}, conf));
  REQUIRE(logged(a, "started ranks"));
  REQUIRE(logged(b, "started ranks"));
  std::this_thread::sleep_for(1s);  // the watches set up (a window of rest, not a wait for a state)
  const auto before = cluster.requests();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(5s);
  const auto after = cluster.requests();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  double total = 0;
  std::string kinds;
  for (const auto& [kind, n] : after) {
    const double per = (n - (before.count(kind) ? before.at(kind) : 0.0)) / s / 2;
    total += per;
    if (per > 0) kinds += kind + " " + std::to_string(per) + "/s; ";
  }
  INFO("per node: " << kinds);
  CHECK(total > 1.5);  // the lease's renewals are counted: the metrics are read
  CHECK(total < 4.5);  // was 6-7 a second: a read and a new watch each second, twice
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  a.finish(30s);
  b.finish(30s);
}

TEST_CASE("etcd backend: kill -9 of the etcd leader mid-job - the job finishes without a restart", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  // Workers run ~3 s; the leader dies while they run. The lease (3 s) outlasts the election: a
  // node whose renewals stall for its TTL less the fence margin stops its workers (fencing).
  const std::string conf = "lease_ttl=3,last_call_timeout=1,join_timeout=30";
  Launch a(agent(cluster, "job2", "2", {"--nproc_per_node=1", kWorker, "heartbeat:60:50"}, conf));
  Launch b(agent(cluster, "job2", "2", {"--nproc_per_node=1", kWorker, "heartbeat:60:50"}, conf));
  REQUIRE(logged(a, "started ranks"));
  cluster.kill(cluster.leader());
  auto rb = b.finish(60s), ra = a.finish(60s);
  INFO(ra.err << "\n---\n" << rb.err);
  CHECK(ra.code == 0);
  CHECK(rb.code == 0);
  CHECK_THAT(ra.err + rb.err, !Catch::Contains("round 1"));  // no new round: no restart
}

TEST_CASE("etcd backend: kill -9 of the agent hosting the workers' store - the others restart without it", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  std::vector<std::unique_ptr<Launch>> agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(std::make_unique<Launch>(agent(cluster, "job3", "2:3", {"--nproc_per_node=1", kWorker, "heartbeat:40:50"})));
  }
  int host = -1;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(logged(*agents[i], "started ranks"));
    if (agents[i]->err().find("node 0 of 3") != std::string::npos) host = i;
  }
  REQUIRE(host >= 0);
  auto t0 = Clock::now();
  agents[host]->signal(SIGKILL);
  for (int i = 0; i < 3; ++i) {
    if (i == host) continue;
    REQUIRE(logged(*agents[i], "rendezvous round 1 complete: 2 nodes"));
  }
  CHECK(Clock::now() - t0 < 3s);
  // Each member watches the next one's record: the member before the lost one sees its lease go
  // and ends the round; the other reads the round's end.
  int saw_lease = 0;
  for (int i = 0; i < 3; ++i) {
    if (i == host) continue;
    auto r = agents[i]->finish(60s);
    INFO(r.err);
    CHECK(r.code == 0);
    saw_lease += r.err.find("lost its etcd lease") != std::string::npos;
    CHECK((r.err.find("lost its etcd lease") != std::string::npos ||
           r.err.find("stopped answering") != std::string::npos));
  }
  CHECK(saw_lease >= 1);
}

TEST_CASE("etcd backend: exhausted restarts end every node with the same root cause", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  Launch a(agent(cluster, "job4", "2", {"--nproc_per_node=1", "--max_restarts=1", kWorker, "exit_if_rank:1:7"}));
  Launch b(agent(cluster, "job4", "2", {"--nproc_per_node=1", "--max_restarts=1", kWorker, "exit_if_rank:1:7"}));
  auto rb = b.finish(60s), ra = a.finish(60s);
  INFO(ra.err << "\n---\n" << rb.err);
  CHECK(ra.code == 7);
  CHECK(rb.code == 7);
  for (const auto* err : {&ra.err, &rb.err}) {
    CHECK_THAT(*err, Catch::Contains("restarting the job on every node (restart 1 of 1)"));
    CHECK_THAT(*err, Catch::Contains("rank       : 1"));
  }
}

TEST_CASE("etcd backend: a late joiner grows the job", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  Launch a(agent(cluster, "job5", "2:3", {"--nproc_per_node=1", kWorker, "block_if_world:2"}));
  Launch b(agent(cluster, "job5", "2:3", {"--nproc_per_node=1", kWorker, "block_if_world:2"}));
  REQUIRE(logged(a, "started ranks"));
  Launch c(agent(cluster, "job5", "2:3", {"--nproc_per_node=1", kWorker, "block_if_world:2"}));
  auto rc = c.finish(60s), rb = b.finish(60s), ra = a.finish(60s);
  INFO(ra.err << "\n---\n" << rb.err << "\n---\n" << rc.err);
  CHECK(ra.code == 0);
  CHECK(rb.code == 0);
  CHECK(rc.code == 0);
  CHECK_THAT(ra.err, Catch::Contains("rendezvous round 1 complete: 3 nodes"));
}

TEST_CASE("etcd backend: etcd unreachable is a clear error naming the endpoints", "[etcd]") {
  auto port = std::to_string(ddprun::rounds::testing::free_port());
  auto r = Launch(cmd({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=x",
                       "--rdzv_conf=lease_ttl=1", kWorker, "env"}))
               .finish(60s);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot reach etcd at 127.0.0.1:" + port) && !Catch::Contains("overloaded"));
  auto bad = Launch(cmd({"--nnodes=2", "--rdzv_backend=etcd", kWorker})).finish(30s);
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--rdzv_backend=etcd needs --rdzv_endpoint"));
}

TEST_CASE("etcd backend: etcd that stops answering a joining node is named as what the node waited for", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  Launch a(agent(cluster, "job6", "2", {"--nproc_per_node=1", kWorker, "env"}, "lease_ttl=2,join_timeout=60"));
  // Arrived (its record is there): it waits for the second node. etcd answers nothing from now on
  // (every member paused).
  EtcdClient c({cluster.endpoints(), 5s});
  const auto until = Clock::now() + 20s;
  while (!c.get("/ddprun/job6/r0/node/0") && Clock::now() < until) a.wait_for("\x01", 1, 50ms);
  REQUIRE(c.get("/ddprun/job6/r0/node/0"));
  for (int i = 0; i < 3; ++i) cluster.pause(i);
  auto t0 = Clock::now();
  auto r = a.finish(30s);
  auto took = Clock::now() - t0;
  for (int i = 0; i < 3; ++i) cluster.resume(i);
  INFO(r.err);
  CHECK(r.code == 1);
  // One request of the join went unanswered for its call's time (lease_ttl), and the message says
  // that, not the watch's ride-out (read_timeout, 60 s) that it did not wait for.
  CHECK_THAT(r.err, Catch::Contains("lost etcd at " + cluster.endpoint_list() + " while joining: cannot reach etcd") &&
                        Catch::Contains("within 2 s") && Catch::Contains("--rdzv_conf lease_ttl") &&
                        !Catch::Contains("no member answered for"));
  CHECK(took < 20s);
}

TEST_CASE("etcd backend: etcd that takes a new node's requests and answers none in time - the message names the setting that gives it longer", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  for (int i = 0; i < 3; ++i) cluster.pause(i);  // connections accepted, nothing answered
  auto r = Launch(agent(cluster, "job7", "2", {"--nproc_per_node=1", kWorker, "env"}, "lease_ttl=2,join_timeout=60")).finish(30s);
  for (int i = 0; i < 3; ++i) cluster.resume(i);
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot reach etcd at 127.0.0.1:") && Catch::Contains("within 2 s") &&
                        Catch::Contains("overloaded, a larger --rdzv_conf lease_ttl"));
}

TEST_CASE("etcd backend: authentication - the job's user is served, a wrong password exits 1 saying so", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/etcdctl"), "etcdctl is not installed (scripts/setup.sh installs etcd-client)");
  EtcdCluster cluster(1);
  std::string ctl = "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=" + cluster.endpoint_list();
  REQUIRE(std::system((ctl + " user add root:s3cret >/dev/null 2>&1 && " + ctl + " auth enable >/dev/null 2>&1").c_str()) == 0);
  auto with = [&](const std::string& password) {
    return cmd({"--nnodes=1:2", "--rdzv_backend=etcd", "--rdzv_endpoint=" + cluster.endpoint_list(), "--rdzv_id=auth",
                "--rdzv_conf=lease_ttl=1,last_call_timeout=0.2,user=root,password=" + password, "--nproc_per_node=1",
                kWorker, "env"});
  };
  // (nnodes 1:2: one agent is a job; a second Launch runs after the first finished.)
  auto ok = Launch(with("s3cret")).finish(60s);
  INFO(ok.err);
  CHECK(ok.code == 0);
  auto refused = Launch(with("guess")).finish(60s);
  CHECK(refused.code == 1);
  CHECK_THAT(refused.err, Catch::Contains("refused ddprun"));
  CHECK_THAT(refused.err, Catch::Contains("user, password"));
}

TEST_CASE("etcd backend over TLS: agents meet through a TLS-only cluster with client certificates - a wrong CA exits 1, "
          "a cluster that finishes no handshake names lease_ttl", "[etcd][tls]") {
  SKIP_WITHOUT_ETCD();
  SKIP_UNLESS(TestPki::available(), "openssl is not installed (scripts/setup.sh installs openssl)");
  TestPki pki;
  auto server = pki.server("etcd", "IP:127.0.0.1");
  EtcdCluster cluster(3, {server.cert, server.key, pki.ca(), true});
  auto node = pki.client("node");
  const std::string tls = "cacert=" + pki.ca() + ",cert=" + node.cert + ",key=" + node.key;
  const std::string conf = "lease_ttl=1,last_call_timeout=1,join_timeout=30," + tls;
  // Endpoints as etcdctl writes them (https://); the lease keeper and the round watch use TLS too.
  Launch a(agent(cluster, "tls1", "2", {"--nproc_per_node=1", kWorker, "heartbeat:20:50"}, conf));
  Launch b(agent(cluster, "tls1", "2", {"--nproc_per_node=1", kWorker, "heartbeat:20:50"}, conf));
  auto rb = b.finish(60s), ra = a.finish(60s);
  INFO(ra.err << "\n---\n" << rb.err);
  CHECK(ra.code == 0);
  CHECK(rb.code == 0);
  CHECK_THAT(ra.err + rb.err, Catch::Contains("rendezvous round 0 complete: 2 nodes"));
  // The same job with another CA: the node says which member and what to check.
  const std::string other = "lease_ttl=1,join_timeout=30,cacert=" + pki.ca("other") + ",cert=" + node.cert + ",key=" + node.key;
  auto refused = Launch(agent(cluster, "tls2", "1:2", {"--nproc_per_node=1", kWorker, "env"}, other)).finish(60s);
  CHECK(refused.code == 1);
  CHECK_THAT(refused.err, Catch::Contains("cannot reach etcd at 127.0.0.1:" + std::to_string(cluster.client_port(0))));
  CHECK_THAT(refused.err, Catch::Contains("is not signed by the CA in --rdzv_conf cacert"));
  // https:// without a CA is a usage error before anything starts.
  auto usage = Launch(agent(cluster, "tls3", "1:2", {kWorker, "env"}, "lease_ttl=1")).finish(30s);
  CHECK(usage.code == 2);
  CHECK_THAT(usage.err, Catch::Contains("uses TLS: give --rdzv_conf cacert=PATH"));
  // Every member stopped: the kernel takes the connections, no handshake is answered. That is a
  // busy cluster (as the plain one's unanswered requests above), not a TLS set-up to check.
  for (int i = 0; i < 3; ++i) cluster.pause(i);
  auto busy = Launch(agent(cluster, "tls4", "2", {"--nproc_per_node=1", kWorker, "env"},
                           "lease_ttl=2,join_timeout=60," + tls)).finish(30s);
  for (int i = 0; i < 3; ++i) cluster.resume(i);
  INFO(busy.err);
  CHECK(busy.code == 1);
  CHECK_THAT(busy.err, Catch::Contains("the TLS handshake with 127.0.0.1:") &&
                           Catch::Contains("took the connection and did not answer") &&
                           Catch::Contains("overloaded, a larger --rdzv_conf lease_ttl"));
}
