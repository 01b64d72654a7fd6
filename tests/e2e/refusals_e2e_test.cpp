// Told at once what is in use: a second agent with a node rank a live node holds, and a second
// job with a run id a job with other settings uses, exit 1 within seconds naming it, while the
// running job is not disturbed; a second agent with a node rank, stopped by a signal, stops
// nobody else. A rank whose holder died is not in use: its replacement gets it.
#include <catch2/catch.hpp>
#include <csignal>

#include "ddprun/common/system.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "e2e/agents.hpp"

using namespace ddprun::test;

// Rank 1's holder is alive, and shows it by a counter it bumps: `held` every third of a liveness
// TTL while round 0 waits for rank 2, its keep-alive counter while round 0 runs. A second
// --node_rank=1 exits 1 at its next look at them, a little over a third of the TTL after its
// claim, naming the holder's host (while the round was open it waited silently until
// join_timeout; while it ran, two TTLs).
TEST_CASE("a node rank already held by a live node is refused within a third of the TTL, naming its host",
          "[multinode]") {
  const bool open = GENERATE(true, false);
  INFO((open ? "round 0 open (waiting for rank 2)" : "round 0 running"));
  // TTL 3 s: a look 1.3 s after the claim.
  const std::string conf = "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=60";
  const std::string nnodes = open ? "--nnodes=3" : "--nnodes=2";
  // While round 0 runs, its workers block until the test stops them.
  auto node = [&](int rank, const std::string& port, bool block) {
    std::vector<std::string> c = cmd({nnodes, "--node_rank=" + std::to_string(rank), "--master_port=" + port, conf,
                                      "--nproc_per_node=1", kWorker, "env"});
    if (block) c.insert(c.end(), {"ready", "block"});
    return c;
  };
  Launch n0(node(0, "0", !open));
  auto port = host_port(n0);
  Launch n1(node(1, port, !open));
  ddprun::rendezvous::TcpStore store({.host = "127.0.0.1", .port = static_cast<std::uint16_t>(std::stoi(port)),
                                      .timeout = 20s, .secret = {}, .pointed_by = {}});
  if (open) {
    store.wait({"ddprun/rdzv/none/r0/node/0", "ddprun/rdzv/none/r0/node/1"}, 20s);
  } else {
    REQUIRE(n0.wait_for("ready"));
    REQUIRE(n1.wait_for("ready"));
  }
  auto again = Launch(node(1, port, false)).finish(15s);
  INFO(again.err);
  CHECK(again.code == 1);
  CHECK_THAT(again.err, Catch::Contains("node rank 1 is already held by " + ddprun::host_name() + " (alive: its " +
                                        (open ? "held" : "keep-alive") + " counter moved") &&
                            Catch::Contains("give each node its own --node_rank"));
  CHECK(again.seconds < 3);  // TTL / 3 + 0.3 s (1.3 s), and the agent's start and exit
  // The job it tried to join is not disturbed.
  if (open) {
    Launch n2(node(2, port, false));
    auto r2 = n2.finish(30s), r1 = n1.finish(30s), r0 = n0.finish(30s);
    INFO(r0.err << "\n---\n" << r1.err);
    CHECK(r0.code == 0);
    CHECK(r1.code == 0);
    CHECK(r2.code == 0);
    CHECK_THAT(r1.out, Catch::Contains("GROUP_WORLD_SIZE=3"));
  } else {
    CHECK(n0.err().find("round 0:") != std::string::npos);
    CHECK(n0.err().find("round 1") == std::string::npos);
    n0.signal(SIGTERM);
    n1.signal(SIGTERM);
    n0.finish(20s);
    n1.finish(20s);
  }
}

// A second --node_rank=1 started by mistake and stopped (Ctrl-C, SIGTERM) while round 0 waits for
// rank 2 is a member of no round: its stop reaches nobody. The two healthy nodes go on and, once
// rank 2 comes, the job ends 0 (they exited 128 + signal: "the job was stopped by ... during the
// rendezvous").
TEST_CASE("a duplicate node rank stopped by a signal leaves the healthy nodes running", "[multinode]") {
  const int sig = GENERATE(SIGTERM, SIGINT);
  INFO("signal " << sig);
  // The default liveness TTL (15 s): the duplicate is refused only 6.5 s after its claim, and the
  // signal comes first.
  const std::string conf = "--rdzv_conf=join_timeout=60";
  auto node = [&](int rank, const std::string& port) {
    return cmd({"--nnodes=3", "--node_rank=" + std::to_string(rank), "--master_port=" + port, conf, "--nproc_per_node=1",
                kWorker, "env"});
  };
  Launch n0(node(0, "0"));
  auto port = host_port(n0);
  Launch n1(node(1, port));
  ddprun::rendezvous::TcpStore store({.host = "127.0.0.1", .port = static_cast<std::uint16_t>(std::stoi(port)),
                                      .timeout = 20s, .secret = {}, .pointed_by = {}});
  store.wait({"ddprun/rdzv/none/r0/node/0", "ddprun/rdzv/none/r0/node/1"}, 20s);
  {
    Launch dup(node(1, port));
    // In the rendezvous: its claim on its way or refused (either way a member of no round).
    auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline && dup.err().find("joining the rendezvous") == std::string::npos) dup.wait_for("\x01", 1, 50ms);
    REQUIRE(dup.err().find("joining the rendezvous") != std::string::npos);
    dup.signal(sig);
    auto rd = dup.finish(10s);
    INFO(rd.err);
    CHECK(rd.code == 128 + sig);
    CHECK(rd.seconds < 5);
  }
  Launch n2(node(2, port));
  auto r2 = n2.finish(30s), r1 = n1.finish(30s), r0 = n0.finish(30s);
  INFO(r0.err << "\n---\n" << r1.err << "\n---\n" << r2.err);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(r2.code == 0);
  CHECK(r0.err.find("the job was stopped") == std::string::npos);
  CHECK_THAT(r0.out, Catch::Contains("GROUP_WORLD_SIZE=3"));
  CHECK_THAT(r1.out, Catch::Contains("GROUP_RANK=1"));
}

TEST_CASE("a second job with a run id in use by other settings is refused at once, naming both", "[multinode]") {
  Launch a(cmd({"--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=job7",
                "--rdzv_conf=last_call_timeout=0.2", "--nproc_per_node=1", kWorker, "ready", "block"}));
  auto port = host_port(a);
  REQUIRE(a.wait_for("ready"));
  auto other = Launch(cmd({"--nnodes=4", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=job7",
                           "--nproc_per_node=1", kWorker, "env"}))
                   .finish(30s);
  INFO(other.err);
  CHECK(other.code == 1);
  CHECK_THAT(other.err, Catch::Contains("run id 'job7' is in use") && Catch::Contains("c10d, 1 to 2 nodes") &&
                            Catch::Contains("this node: c10d, 4 nodes") && Catch::Contains("--rdzv_id"));
  CHECK(other.seconds < 3);
  a.signal(SIGTERM);
  auto ra = a.finish(20s);
  CHECK(ra.code == 128 + SIGTERM);
}

// Static ranks, three nodes: rank 1's agent is killed while it waits in round 0 for rank 2 (its
// arrival is in the store: the store has no other sign of its life before a round runs). Its
// replacement was refused "node rank in use" at join_timeout, and every later one too: now, once
// the holder's `held` counter stayed still for TTL + 2 x read_timeout, it abandons round 0 and the
// job forms in round 1.
TEST_CASE("a node rank whose holder was killed before its round closed goes to its replacement", "[multinode]") {
  const std::string conf =
      "--rdzv_conf=keep_alive_interval=0.2,keep_alive_max_attempt=3,read_timeout=1,join_timeout=30,last_call_timeout=1";
  auto node = [&](int rank, const std::string& port) {
    return cmd({"--nnodes=3", "--node_rank=" + std::to_string(rank), "--master_port=" + port, conf, "--nproc_per_node=1",
                kWorker, "env"});
  };
  Launch n0(node(0, "0"));
  const auto port = host_port(n0);
  ddprun::rendezvous::TcpStore store({.host = "127.0.0.1", .port = static_cast<std::uint16_t>(std::stoi(port)),
                                      .timeout = 20s, .secret = {}, .pointed_by = {}});
  {
    Launch n1(node(1, port));
    // Both arrived in round 0 (in either order: node/1 is the second arrival's record).
    store.wait({"ddprun/rdzv/none/r0/node/0", "ddprun/rdzv/none/r0/node/1"}, 20s);
    n1.signal(SIGKILL);
    n1.finish(10s);
  }
  const auto t0 = Clock::now();
  Launch again(node(1, port));
  store.wait({"ddprun/rdzv/none/r0/closed"}, 15s);  // before join_timeout
  CHECK_THAT(store.get("ddprun/rdzv/none/r0/closed"), Catch::Contains("abandoned"));
  CHECK(Clock::now() - t0 >= 2s);  // TTL 0.6 s + 2 x read_timeout: not before
  Launch n2(node(2, port));
  auto r2 = n2.finish(60s), r1 = again.finish(60s), r0 = n0.finish(60s);
  INFO(r0.err << "\n---\n" << r1.err << "\n---\n" << r2.err);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(r2.code == 0);
  CHECK_THAT(r1.err, Catch::Contains("stopped showing it is alive before the round closed"));
  CHECK(r1.err.find("already held") == std::string::npos);
  CHECK_THAT(r1.out, Catch::Contains("GROUP_RANK=1") && Catch::Contains("GROUP_WORLD_SIZE=3"));
  CHECK_THAT(r1.out, Catch::Contains("TORCHELASTIC_RESTART_COUNT=0"));
}
