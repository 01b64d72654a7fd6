// Told at once what is in use: a second agent with a node rank a live node holds, and a second
// job with a run id a job with other settings uses, exit 1 within seconds naming it, while the
// running job is not disturbed.
#include <catch2/catch.hpp>

#include "e2e/agents.hpp"

using namespace ddprun::test;

TEST_CASE("a node rank already held by a live node is refused within seconds, naming it", "[multinode]") {
  const std::string conf = "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4";
  Launch n0(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", conf, "--nproc_per_node=1", kWorker, "ready", "block"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, conf, "--nproc_per_node=1", kWorker, "ready",
                 "block"}));
  REQUIRE(n0.wait_for("ready"));
  REQUIRE(n1.wait_for("ready"));
  auto again = Launch(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, conf, "--nproc_per_node=1", kWorker,
                           "env"}))
                   .finish(30s);
  INFO(again.err);
  CHECK(again.code == 1);
  CHECK_THAT(again.err, Catch::Contains("node rank 1 is already in use in run 'none'") &&
                            Catch::Contains("give each node a distinct --node_rank"));
  CHECK(again.seconds < 5);  // the liveness TTL (2 s) + 1 s, not the join time-out
  // The job it tried to join runs on.
  CHECK(n0.err().find("round 0:") != std::string::npos);
  CHECK(n0.err().find("round 1") == std::string::npos);
  n0.signal(SIGTERM);
  n1.signal(SIGTERM);
  n0.finish(20s);
  n1.finish(20s);
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
