// Several agents on one machine (loopback) forming one job: static and c10d rendezvous,
// uneven nodes, global restarts, lost nodes, late and extra joiners, the store host leaving.
// The first agent hosts the store on a free port (--master_port=0 or an endpoint with port 0)
// and prints it; the others are started with that port: no fixed ports.

#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "ddprun/rendezvous/tcp_store.hpp"
#include "e2e/agents.hpp"
#include "e2e/http_client.hpp"

using namespace ddprun::test;

namespace {


std::map<int, std::map<std::string, std::string>> worker_env(const std::string& out) {
  // rank -> variables, from "[default<local>]:KEY=VALUE" lines of one agent
  std::map<int, std::map<std::string, std::string>> by_local;
  std::regex re(R"(\[default(\d+)\]:([A-Z_]+)=(.*))");
  for (const auto& l : lines(out)) {
    std::smatch m;
    if (std::regex_match(l, m, re)) by_local[std::stoi(m[1])][m[2]] = m[3];
  }
  return by_local;
}

}  // namespace

TEST_CASE("static rendezvous: 2 agents x 2 workers form one job with contiguous ranks", "[multinode]") {
  Launch n0(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", "--nproc_per_node=2", kWorker, "env"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, "--nproc_per_node=2", kWorker, "env"}));
  auto r1 = n1.finish(60s);
  auto r0 = n0.finish(60s);
  INFO(r0.err << r1.err);
  REQUIRE(r0.code == 0);
  REQUIRE(r1.code == 0);
  auto e0 = worker_env(r0.out), e1 = worker_env(r1.out);
  std::set<std::string> ports;
  for (int local = 0; local < 2; ++local) {
    CHECK(e0[local]["RANK"] == std::to_string(local));
    CHECK(e1[local]["RANK"] == std::to_string(2 + local));
    CHECK(e0[local]["GROUP_RANK"] == "0");
    CHECK(e1[local]["GROUP_RANK"] == "1");
    for (auto* e : {&e0, &e1}) {
      CHECK((*e)[local]["WORLD_SIZE"] == "4");
      CHECK((*e)[local]["GROUP_WORLD_SIZE"] == "2");
      CHECK((*e)[local]["LOCAL_WORLD_SIZE"] == "2");
      ports.insert((*e)[local]["MASTER_PORT"]);
    }
  }
  CHECK(ports.size() == 1);  // every worker on every node uses the same store
  CHECK(*ports.begin() != port);  // the workers' store, not the agents' rendezvous store
}

TEST_CASE("c10d rendezvous: 3 agents with 1, 2 and 3 workers", "[multinode]") {
  std::string conf = "--rdzv_conf=last_call_timeout=30,join_timeout=30";
  Launch a(cmd({"--nnodes=3", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=uneven", conf,
                "--nproc_per_node=1", kWorker, "env"}));
  auto port = host_port(a);
  std::string ep = "--rdzv_endpoint=127.0.0.1:" + port;
  Launch b(cmd({"--nnodes=3", "--rdzv_backend=c10d", ep, "--rdzv_id=uneven", conf, "--nproc_per_node=2", kWorker, "env"}));
  Launch c(cmd({"--nnodes=3", "--rdzv_backend=c10d", ep, "--rdzv_id=uneven", conf, "--nproc_per_node=3", kWorker, "env"}));
  std::vector<Result> rs = {a.finish(60s), b.finish(60s), c.finish(60s)};
  std::set<int> ranks;
  std::set<std::string> group_ranks;
  for (const auto& r : rs) {
    INFO(r.err);
    REQUIRE(r.code == 0);
    auto env = worker_env(r.out);
    int lo = 1 << 30, hi = -1;
    for (auto& [local, vars] : env) {
      CHECK(vars["WORLD_SIZE"] == "6");
      CHECK(vars["GROUP_WORLD_SIZE"] == "3");
      int rank = std::stoi(vars["RANK"]);
      ranks.insert(rank);
      lo = std::min(lo, rank);
      hi = std::max(hi, rank);
      group_ranks.insert(vars["GROUP_RANK"]);
    }
    CHECK(hi - lo + 1 == static_cast<int>(env.size()));  // contiguous per node
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3, 4, 5});
  CHECK(group_ranks == std::set<std::string>{"0", "1", "2"});
}

// The voluntary context switches of every thread of process `pid` so far.
long long wakeups(pid_t pid) {
  long long sum = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream status(t.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) sum += std::stoll(line.substr(24));
    }
  }
  return sum;
}

TEST_CASE("a job at rest, its workers saving no state: each agent wakes a few times a second, not 20", "[multinode]") {
  // Its in-memory state's threads (the copies, their server, the persist requests) sleep while
  // there is nothing to copy: a thousand agents sharing a machine once spent a core looking.
  std::string conf = "--rdzv_conf=last_call_timeout=30,join_timeout=30";
  Launch a(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=rest", conf,
                "--nproc_per_node=1", kWorker, "sleep:60000"}));
  std::string ep = "--rdzv_endpoint=127.0.0.1:" + host_port(a);
  Launch b(cmd({"--nnodes=2", "--rdzv_backend=c10d", ep, "--rdzv_id=rest", conf, "--nproc_per_node=1", kWorker,
                "sleep:60000"}));
  const auto deadline = Clock::now() + 30s;
  while (b.err().find("started ranks") == std::string::npos && Clock::now() < deadline) b.wait_for("\x01", 1, 50ms);
  REQUIRE(b.err().find("started ranks") != std::string::npos);
  std::this_thread::sleep_for(2s);  // the round's first moments over (a window of rest, not a wait for a state)
  const long long before = wakeups(b.pid());
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(5s);
  const double per_s = static_cast<double>(wakeups(b.pid()) - before) /
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("the agent's threads woke " << per_s << " times a second");
  CHECK(per_s > 0.5);  // counted: its loop's once-a-second look at the job
  CHECK(per_s < 10);   // was 19 (the copies every 100 ms, the persist requests every 200 ms, the server every second)
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  a.finish(30s);
  b.finish(30s);
}

TEST_CASE("after a restart, workers that have not stepped yet: the agent does not look for their first beat 200 times a second", "[multinode]") {
  // The restart is timed until every worker's first step (its "ready"); a worker that takes long
  // to step, or never does (this one), is looked at less and less often: each look at most 5%
  // of the wait late. Looked at every 5 ms, 256 agents restarting on two cores spent 63 ms of
  // CPU each instead of 11.
  Launch a(cmd({"--nproc_per_node=2", "--max_restarts=1", kWorker, "fail_before_attempt:1:3", "sleep:60000"}));
  const auto deadline = Clock::now() + 30s;
  while (a.err().find("(attempt 1") == std::string::npos && Clock::now() < deadline) a.wait_for("\x01", 1, 50ms);
  REQUIRE(a.err().find("(attempt 1") != std::string::npos);
  std::this_thread::sleep_for(1s);  // the new workers started (their first moments over)
  const long long before = wakeups(a.pid());
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(3s);
  const double per_s = static_cast<double>(wakeups(a.pid()) - before) /
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("the agent's threads woke " << per_s << " times a second\n" << a.err());
  CHECK(per_s < 50);  // every 5 ms: over 200
  a.signal(SIGTERM);
  a.finish(30s);
}

TEST_CASE("a worker failing on node 1 restarts node 0's workers too, with one global restart count", "[multinode]") {
  // RANK 1 lives on node 0; make node 1's worker (rank 3) fail instead: fail_before_attempt
  // fails RANK 1 only, so run 2 workers on node 0 and 2 on node 1 and let rank 1 fail: then
  // check node 1 restarted as well.
  Launch n0(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", "--nproc_per_node=2", "--max_restarts=2", kWorker,
                 "fail_before_attempt:2:5", "block_if_attempt:0", "block_if_attempt:1", "env"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, "--nproc_per_node=2", "--max_restarts=2",
                 kWorker, "fail_before_attempt:2:5", "block_if_attempt:0", "block_if_attempt:1", "env"}));
  auto r1 = n1.finish(60s);
  auto r0 = n0.finish(60s);
  INFO(r0.err << "\n----\n" << r1.err);
  REQUIRE(r0.code == 0);
  REQUIRE(r1.code == 0);
  for (const auto* r : {&r0, &r1}) {
    auto env = worker_env(r->out);
    for (auto& [local, vars] : env) CHECK(vars["TORCHELASTIC_RESTART_COUNT"] == "2");
    CHECK(Launch::occurrences(r->err, "restarting the job on every node") == 2);
  }
  CHECK_THAT(r1.err, Catch::Contains("failed on host"));  // node 1 learnt of node 0's failure
}

TEST_CASE("exhausted restarts: every node prints the same root cause and exits with its code", "[multinode]") {
  Launch n0(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", "--nproc_per_node=1", kWorker, "block"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, "--nproc_per_node=1", kWorker,
                 "stderr:node one breaks", "exit:42"}));
  auto r1 = n1.finish(60s);
  auto r0 = n0.finish(60s);
  INFO(r0.err << "\n----\n" << r1.err);
  CHECK(r0.code == 42);
  CHECK(r1.code == 42);
  for (const auto* r : {&r0, &r1}) {
    CHECK_THAT(r->err, Catch::Contains("rank       : 1 (local_rank 0"));
    CHECK_THAT(r->err, Catch::Contains("failure    : exit code 42"));
    CHECK_THAT(r->err, Catch::Contains("node one breaks"));
  }
}

TEST_CASE("crash loop across nodes: a node that missed the first failure ends with the same verdict (93)", "[multinode]") {
  // a (2 workers) alone: rank 1 exits 3 in round 0, round 1 blocks. b, new, asks to join: rank 1
  // exits 3 again in round 2. 2 in a row for the job, 1 in b's own history: both must call it a
  // crash loop (b used to restart, find the job finished and exit 1).
  auto agent = [&](const std::string& ep, const std::string& nproc, const std::string& last_call) {
    return cmd({"--nnodes=1:2", "--rdzv_backend=c10d", ep, "--rdzv_id=loop",
                "--rdzv_conf=join_timeout=30,last_call_timeout=" + last_call, "--nproc_per_node=" + nproc,
                "--max_restarts=5", "--max_same_failures=2", kWorker, "fail_before_attempt:1:3", "block_if_world:2",
                "exit_if_rank:1:3", "block"});
  };
  Launch a(agent("--rdzv_endpoint=127.0.0.1:0", "2", "0.5"));
  auto port = host_port(a);
  auto deadline = Clock::now() + 30s;
  while (a.err().find("rendezvous round 1 complete") == std::string::npos && Clock::now() < deadline) a.wait_for("\x01", 1, 50ms);
  REQUIRE_THAT(a.err(), Catch::Contains("restarting the job on every node (restart 1 of 5)"));
  Launch b(agent("--rdzv_endpoint=127.0.0.1:" + port, "1", "20"));
  auto rb = b.finish(60s);
  auto ra = a.finish(60s);
  INFO(ra.err << "\n----\n" << rb.err);
  CHECK_THAT(rb.err, Catch::Contains("complete: 2 nodes, 3 workers"));
  for (const auto* r : {&ra, &rb}) {
    CHECK(r->code == 93);
    CHECK_THAT(r->err, Catch::Contains("Crash loop: rank 1 failed the same way (exit code 3) on 2 consecutive attempts"));
  }
}

TEST_CASE("kill -9 of a non-host agent: the survivors continue with a smaller world", "[multinode]") {
  std::string conf = "--rdzv_conf=keep_alive_interval=0.3,keep_alive_max_attempt=2,last_call_timeout=20,join_timeout=30";
  auto agent = [&](const std::string& ep) {
    return cmd({"--nnodes=2:3", "--rdzv_backend=c10d", ep, "--rdzv_id=shrink", conf, "--nproc_per_node=1", kWorker,
                "block_if_world:3", "env"});
  };
  Launch a(agent("--rdzv_endpoint=127.0.0.1:0"));
  auto port = host_port(a);
  Launch b(agent("--rdzv_endpoint=127.0.0.1:" + port));
  Launch c(agent("--rdzv_endpoint=127.0.0.1:" + port));
  REQUIRE(a.wait_for("ready"));
  REQUIRE(b.wait_for("ready"));
  REQUIRE(c.wait_for("ready"));
  auto t0 = Clock::now();
  c.signal(SIGKILL);
  auto rc = c.finish();
  auto ra = a.finish(60s), rb = b.finish(60s);
  INFO(ra.err << "\n----\n" << rb.err);
  CHECK(ra.code == 0);
  CHECK(rb.code == 0);
  CHECK_THAT(ra.out + rb.out, Catch::Contains("WORLD_SIZE=2"));
  CHECK_THAT(ra.err + rb.err, Catch::Contains("stopped answering"));
  CHECK(Clock::now() - t0 < 15s);
}

TEST_CASE("a lost node's detection counts the keep-alive silence: in the recovery line, the event and the metric",
          "[multinode]") {
  // Liveness TTL: keep_alive_interval 0.5 s x keep_alive_max_attempt 2 = 1 s. The survivor learns
  // of the loss no sooner than a TTL after b's last keep-alive, and says so.
  const double ttl = 1.0;
  std::string conf = "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=20,join_timeout=30";
  std::string dir = temp_dir();
  auto agent = [&](const std::string& ep, std::vector<std::string> extra) {
    auto args = cmd({"--nnodes=1:2", "--rdzv_backend=c10d", ep, "--rdzv_id=detect", conf, "--nproc_per_node=1"});
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {kWorker.c_str(), "block_if_world:2", "heartbeat:1:10", "block"}) args.push_back(a);
    return args;
  };
  Launch a(agent("--rdzv_endpoint=127.0.0.1:0", {"--metrics_port=0", "--events_file=" + dir + "/events.jsonl"}));
  auto port = host_port(a);
  Launch b(agent("--rdzv_endpoint=127.0.0.1:" + port, {}));
  REQUIRE(a.wait_for("ready"));
  REQUIRE(b.wait_for("ready"));
  b.signal(SIGKILL);
  b.finish();
  // a goes on alone: its worker beats once, so its recovery is complete and shown.
  std::smatch m;
  const std::regex line(R"(restarted in [0-9.]+ s: detect ([0-9.]+) (ms|s),)");
  auto deadline = Clock::now() + 30s;
  while (!std::regex_search(a.err(), m, line) && Clock::now() < deadline) a.wait_for("\x01", 1, 50ms);
  const std::string err = a.err();
  INFO(err);
  REQUIRE(std::regex_search(err, m, line));
  const double detect_line = std::stod(m[1]) / (m[2] == "ms" ? 1000 : 1);
  CHECK(detect_line >= ttl);
  CHECK(detect_line < ttl + 5);

  std::regex port_re(R"(metrics on port (\d+))");
  REQUIRE(std::regex_search(err, m, port_re));
  const int metrics = std::stoi(m[1]);
  const std::regex sum(R"(ddprun_recovery_seconds_sum\{phase="detect"\} ([0-9.e+-]+))");
  std::string text;
  deadline = Clock::now() + 10s;
  while (!std::regex_search(text, m, sum) && Clock::now() < deadline) {
    text = http_get(metrics, "/metrics").body;
    if (!std::regex_search(text, m, sum)) std::this_thread::sleep_for(100ms);  // refreshed once a second
  }
  INFO(text);
  REQUIRE(std::regex_search(text, m, sum));
  CHECK(std::stod(m[1]) >= ttl);

  a.signal(SIGTERM);
  a.finish(20s);
  std::ifstream in(dir + "/events.jsonl");
  std::stringstream events;
  events << in.rdbuf();
  INFO(events.str());
  std::string recovery;
  for (const auto& l : lines(events.str())) {
    if (l.find("\"event\":\"recovery\"") != std::string::npos) recovery = l;
  }
  const std::regex detect_s(R"("detect_s":([0-9.e+-]+))");
  REQUIRE(std::regex_search(recovery, m, detect_s));
  CHECK(std::stod(m[1]) >= ttl);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a late joiner within the last call is in the first round - one beyond MAX waits", "[multinode]") {
  std::string conf = "--rdzv_conf=last_call_timeout=2,join_timeout=30";
  auto agent = [&](const std::string& ep) {
    return cmd({"--nnodes=1:2", "--rdzv_backend=c10d", ep, "--rdzv_id=late", conf, "--nproc_per_node=1", kWorker,
                "block_if_world:2"});
  };
  Launch a(agent("--rdzv_endpoint=127.0.0.1:0"));
  auto port = host_port(a);
  Launch b(agent("--rdzv_endpoint=127.0.0.1:" + port));  // within a's last call: both in round 0
  REQUIRE(a.wait_for("ready"));
  REQUIRE(b.wait_for("ready"));
  Launch c(agent("--rdzv_endpoint=127.0.0.1:" + port));  // round 0 is full (MAX 2): c waits
  auto deadline = Clock::now() + 20s;
  while (c.err().find("waits for a place") == std::string::npos && Clock::now() < deadline) c.wait_for("\x01", 1, 50ms);
  CHECK_THAT(c.err(), Catch::Contains("round 0 is full (2 of 2 nodes); this node waits for a place"));
  CHECK(a.out().find("ready") != std::string::npos);
  c.signal(SIGTERM);
  c.finish();
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  a.finish();
  b.finish();
}

TEST_CASE("a new node below MAX restarts the job with it, without using the restart budget", "[multinode]") {
  std::string conf = "--rdzv_conf=last_call_timeout=0.5,join_timeout=30";
  auto agent = [&](const std::string& ep) {
    return cmd({"--nnodes=1:3", "--rdzv_backend=c10d", ep, "--rdzv_id=grow", conf, "--nproc_per_node=1", kWorker,
                "block_if_world:1", "env"});
  };
  Launch a(agent("--rdzv_endpoint=127.0.0.1:0"));
  auto port = host_port(a);
  REQUIRE(a.wait_for("ready"));  // running alone (MIN 1)
  Launch b(agent("--rdzv_endpoint=127.0.0.1:" + port));
  auto rb = b.finish(60s), ra = a.finish(60s);
  INFO(ra.err << "\n----\n" << rb.err);
  CHECK(ra.code == 0);
  CHECK(rb.code == 0);
  CHECK_THAT(ra.out, Catch::Contains("WORLD_SIZE=2"));
  CHECK_THAT(ra.out, Catch::Contains("TORCHELASTIC_RESTART_COUNT=0"));  // no restart used
  CHECK_THAT(ra.err, Catch::Contains("wants to join"));
}

TEST_CASE("the store host leaving ends the job on every node quickly and clearly", "[multinode]") {
  Launch n0(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", "--nproc_per_node=1", kWorker, "ready", "block"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, "--nproc_per_node=1", kWorker, "ready", "block"}));
  REQUIRE(n1.wait_for("ready"));
  REQUIRE(n0.wait_for("ready"));
  auto t0 = Clock::now();
  n0.signal(SIGKILL);
  auto r1 = n1.finish(30s);
  INFO(r1.err);
  CHECK(r1.code == 1);
  CHECK_THAT(r1.err, Catch::Contains("lost the rendezvous store at 127.0.0.1:" + port));
  CHECK(Clock::now() - t0 < 10s);
}

TEST_CASE("too few nodes within the join timeout: a clear error", "[multinode]") {
  auto r = Launch(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", "--rdzv_conf=join_timeout=1",
                       "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", kWorker, "env"}))
               .finish(30s);
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("only 1 of the 2 nodes needed joined round 0"));
  CHECK_THAT(r.err, Catch::Contains("join_timeout"));
  // This node hosted the store, gone with it: the same run id takes a lower --nnodes.
  CHECK_THAT(r.err, Catch::Contains("start the other nodes (with this run id, --rdzv_id=") &&
                        !Catch::Contains("new --rdzv_id"));
}

TEST_CASE("a long wait for nodes or for the store is not a silent one", "[multinode]") {
  // Static node 0 alone of 3: after 10 s it says how many joined and which node ranks are missing.
  Launch n0(cmd({"--nnodes=3", "--node_rank=0", "--master_port=0", "--rdzv_conf=join_timeout=11", kWorker, "env"}));
  // A node whose store nobody hosts: a port bound and never listened on refuses connections, and
  // no other process can take it meanwhile.
  struct Refusing {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    std::uint16_t port = 0;
    Refusing() {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof(a);
      REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
      REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
      port = ntohs(a.sin_port);
    }
    ~Refusing() { ::close(fd); }
  } refusing;
  Launch n2(cmd({"--nnodes=3", "--node_rank=2", "--master_addr=127.0.0.1", "--master_port=" + std::to_string(refusing.port),
                 "--rdzv_conf=join_timeout=11", kWorker, "env"}));
  auto r0 = n0.finish(40s), r2 = n2.finish(40s);
  INFO(r0.err << "\n----\n" << r2.err);
  CHECK(r0.code == 1);
  CHECK_THAT(r0.err, Catch::Contains("waiting for nodes: 1 of the 3 needed have joined round 0 of run id 'none'") &&
                         Catch::Contains("missing --node_rank 1, 2"));
  CHECK(r2.code == 1);
  CHECK_THAT(r2.err, Catch::Contains("no store answers at 127.0.0.1:") && Catch::Contains("yet (") &&
                         Catch::Contains("trying for"));
  CHECK_THAT(r2.err, Catch::Contains("is node 0's ddprun") && Catch::Contains("--master_addr and --master_port right?"));
}

TEST_CASE("SIGINT on one node stops the job on every node, all exiting 130", "[multinode]") {
  Launch n0(cmd({"--nnodes=2", "--node_rank=0", "--master_port=0", "--nproc_per_node=1", kWorker, "ready", "block"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--node_rank=1", "--master_port=" + port, "--nproc_per_node=1", kWorker, "ready", "block"}));
  REQUIRE(n0.wait_for("ready"));
  REQUIRE(n1.wait_for("ready"));
  n1.signal(SIGINT);
  auto r1 = n1.finish(30s), r0 = n0.finish(30s);
  INFO(r0.err << "\n----\n" << r1.err);
  CHECK(r1.code == 130);
  CHECK(r0.code == 130);
  CHECK_THAT(r0.err, Catch::Contains("the job was stopped by SIGINT"));
}

// Anything can be written into an unsecured store. A malformed record where the agents expect
// a round's end (not JSON, wrong field type, truncated) must end the round cleanly: every agent
// stops its workers and exits 1 naming the key; before, json::type_error escaped the event loop.
TEST_CASE("a malformed round record: every agent exits 1 naming the key, no worker left", "[multinode]") {
  struct Variant {
    const char* id;
    const char* value;
    const char* why;
  };
  for (const auto& v : {Variant{"garbage", "this is not json", "not JSON"},
                        Variant{"wrongtype", R"({"kind":"failure","rank":"one","exit_code":3})", "field 'rank' is a string"},
                        Variant{"truncated", R"({"kind":"fail)", "not JSON"},
                        Variant{"notobject", R"([1,2,3])", "not an object"}}) {
    INFO(v.id);
    std::string conf = "--rdzv_conf=join_timeout=20,last_call_timeout=20";
    Launch a(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", std::string("--rdzv_id=") + v.id,
                  conf, "--nproc_per_node=1", kWorker, "pid", "ready", "block"}));
    auto port = host_port(a);
    Launch b(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port,
                  std::string("--rdzv_id=") + v.id, conf, "--nproc_per_node=1", kWorker, "pid", "ready", "block"}));
    REQUIRE(a.wait_for("ready", 1, 30s));
    REQUIRE(b.wait_for("ready", 1, 30s));
    std::vector<pid_t> pids;
    for (auto* l : {&a, &b}) {
      std::smatch m;
      std::string out = l->out();
      REQUIRE(std::regex_search(out, m, std::regex(R"(pid (\d+))")));
      pids.push_back(std::stoi(m[1]));
    }
    const std::string key = std::string("ddprun/rdzv/") + v.id + "/r0/end";
    // A client gone before the agents end (the host waits for the other connections to close).
    const auto store_port = static_cast<std::uint16_t>(std::stoi(port));
    ddprun::rendezvous::TcpStore({.host = "127.0.0.1", .port = store_port, .timeout = 5s, .secret = {}, .pointed_by = {}}).set(key, v.value);
    auto ra = a.finish(20s);
    auto rb = b.finish(20s);
    INFO(ra.err << rb.err);
    CHECK(ra.code == 1);
    CHECK(rb.code == 1);
    for (const auto* r : {&ra, &rb}) {
      CHECK(r->err.find("malformed value at key '" + key + "'") != std::string::npos);
      CHECK(r->err.find(v.why) != std::string::npos);
      CHECK(r->err.find("terminate called") == std::string::npos);
    }
    for (pid_t p : pids) CHECK(process_gone(p, 5s));
  }
}

// Ctrl-C while agents wait in a rendezvous: the signalled agent tells the others (the round is
// ended "stopped" and their waits woken), so every agent exits 130 at once, not at its join
// time-out. Signalling the store's host and another agent both work.
TEST_CASE("SIGINT to one agent waiting in a rendezvous stops every agent with 130 within 2 s", "[multinode]") {
  for (bool signal_host : {false, true}) {
    INFO((signal_host ? "signal the host" : "signal the other agent"));
    std::string id = signal_host ? "sigrdzv_host" : "sigrdzv_other";
    std::string conf = "--rdzv_conf=join_timeout=60,last_call_timeout=60";
    // nnodes=3 with two agents: both wait for a third.
    Launch a(cmd({"--nnodes=3", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=" + id, conf,
                  "--nproc_per_node=1", kWorker, "env"}));
    auto port = host_port(a);
    Launch b(cmd({"--nnodes=3", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=" + id, conf,
                  "--nproc_per_node=1", kWorker, "env"}));
    // b is waiting once it has logged that it joins.
    auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline && b.err().find("joining the rendezvous") == std::string::npos) b.wait_for("\x01", 1, 50ms);
    REQUIRE(b.err().find("joining the rendezvous") != std::string::npos);
    b.wait_for("\x01", 1, 200ms);  // and has sent its arrival
    auto t0 = Clock::now();
    (signal_host ? a : b).signal(SIGINT);
    auto ra = a.finish(10s);
    auto rb = b.finish(10s);
    INFO(ra.err << rb.err);
    CHECK(ra.code == 130);
    CHECK(rb.code == 130);
    CHECK(Clock::now() - t0 < 2s);
    CHECK(ra.out.find("WORLD_SIZE") == std::string::npos);  // no worker ever started
  }
}

TEST_CASE("SIGINT during a re-rendezvous after a lost node: every agent exits 130, no worker left", "[multinode]") {
  std::string conf = "--rdzv_conf=join_timeout=60,last_call_timeout=60,keep_alive_interval=0.2,keep_alive_max_attempt=2";
  auto start = [&](const std::string& ep) {
    return std::make_unique<Launch>(cmd({"--nnodes=3", "--rdzv_backend=c10d", ep, "--rdzv_id=sigrerdzv", conf,
                                         "--nproc_per_node=1", kWorker, "pid", "ready", "block"}));
  };
  auto a = start("--rdzv_endpoint=127.0.0.1:0");
  auto port = host_port(*a);
  auto b = start("--rdzv_endpoint=127.0.0.1:" + port);
  auto c = start("--rdzv_endpoint=127.0.0.1:" + port);
  for (auto* l : {a.get(), b.get(), c.get()}) REQUIRE(l->wait_for("ready", 1, 30s));
  std::vector<pid_t> pids;
  for (auto* l : {a.get(), b.get()}) {
    std::smatch m;
    std::string out = l->out();
    REQUIRE(std::regex_search(out, m, std::regex(R"(pid (\d+))")));
    pids.push_back(std::stoi(m[1]));
  }
  c->signal(SIGKILL);  // a node is lost: a and b stop their workers and rendezvous again (min 3)
  c->finish(10s);
  for (pid_t p : pids) REQUIRE(process_gone(p, 20s));
  auto t0 = Clock::now();
  b->signal(SIGINT);
  auto ra = a->finish(10s);
  auto rb = b->finish(10s);
  INFO(ra.err << rb.err);
  CHECK(ra.code == 130);
  CHECK(rb.code == 130);
  CHECK(Clock::now() - t0 < 2s);
}

// Inside a Slurm step, two agents get nnodes, node_rank, master address and run id from Slurm's
// environment alone (the store's port is the only flag: tests use free ports).
TEST_CASE("two agents started with Slurm environments form one 4-rank world", "[multinode][slurm]") {
  auto slurm_env = [](const char* nodeid) {
    // (srun's: the step's two nodes in a three-node allocation)
    return std::map<std::string, std::string>{{"SLURM_JOB_ID", "777"},          {"SLURM_JOB_NUM_NODES", "3"},
                                              {"SLURM_JOB_NODELIST", "127.0.0.[1-3]"}, {"SLURM_NNODES", "2"},
                                              {"SLURM_NODELIST", "127.0.0.[1-2]"},  {"SLURM_STEP_NUM_NODES", "2"},
                                              {"SLURM_STEP_NODELIST", "127.0.0.[1-2]"}, {"SLURM_STEP_ID", "0"},
                                              {"SLURM_NODEID", nodeid}};
  };
  Launch n0(cmd({"--master_port=0", "--nproc_per_node=2", kWorker, "env"}), slurm_env("0"));
  auto port = host_port(n0);
  Launch n1(cmd({"--master_port=" + port, "--nproc_per_node=2", kWorker, "env"}), slurm_env("1"));
  auto r1 = n1.finish(60s);
  auto r0 = n0.finish(60s);
  INFO(r0.err << r1.err);
  REQUIRE(r0.code == 0);
  REQUIRE(r1.code == 0);
  auto e0 = worker_env(r0.out), e1 = worker_env(r1.out);
  for (int local = 0; local < 2; ++local) {
    CHECK(e0[local]["RANK"] == std::to_string(local));
    CHECK(e1[local]["RANK"] == std::to_string(2 + local));
    CHECK(e0[local]["WORLD_SIZE"] == "4");
    CHECK(e1[local]["GROUP_RANK"] == "1");
    CHECK(e1[local]["TORCHELASTIC_RUN_ID"] == "777-s0");
  }
  CHECK(r0.err.find("inside Slurm job 777") != std::string::npos);
  CHECK(r1.err.find("--node_rank=1") != std::string::npos);
}
