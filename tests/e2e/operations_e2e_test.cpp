// Operating ddprun: the metrics and health endpoints (scraped during a crash and a restart, and
// played against hostile clients), the crash-loop policy, torchrun 2.x's newer flags.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <regex>
#include <sstream>
#include <vector>

#include "e2e/agents.hpp"
#include "e2e/http_client.hpp"

using namespace ddprun::test;
namespace fs = std::filesystem;

namespace {

// The metrics port ddprun printed ("metrics on port N").
int metrics_port(Launch& l) {
  std::regex re(R"(metrics on port (\d+))");
  std::smatch m;
  auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    l.wait_for("\x01", 1, 50ms);
    if (std::regex_search(l.err(), m, re)) return std::stoi(m[1]);
  }
  FAIL("no metrics port in: " << l.err());
  return -1;
}

// Scrapes until `line` appears in /metrics (bounded); returns the last scrape.
std::string scrape_until(int port, const std::string& line, std::chrono::seconds limit = 15s) {
  std::string text;
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    text = http_get(port, "/metrics").body;
    if (text.find(line) != std::string::npos) break;
    std::this_thread::sleep_for(100ms);  // the agent refreshes its snapshot once a second
  }
  return text;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("metrics: scraped during a crash and a restart - phase, restarts, exit codes, heartbeats, store", "[ops]") {
  Launch l(cmd({"--standalone", "--metrics_port=0", "--nproc_per_node=2", "--max_restarts=1", kWorker,
                "fail_before_attempt:1:3", "ready", "block"}));
  int port = metrics_port(l);
  auto text = scrape_until(port, "ddprun_restarts_total 1");
  INFO(text << l.err());
  text = scrape_until(port, "ddprun_workers_running 2");
  CHECK_THAT(text, Catch::Contains("ddprun_phase{phase=\"running\"} 1"));
  CHECK_THAT(text, Catch::Contains("ddprun_restart_count 1"));
  CHECK_THAT(text, Catch::Contains("ddprun_restarts_total 1"));
  CHECK_THAT(text, Catch::Contains("ddprun_worker_last_exit_code{local_rank=\"1\",rank=\"1\"} 3"));
  CHECK_THAT(text, Catch::Contains("ddprun_worker_heartbeat_age_seconds{local_rank=\"0\",rank=\"0\"}"));
  CHECK_THAT(text, Catch::Contains("ddprun_store_connections{store=\"workers\"}"));
  CHECK_THAT(text, Catch::Contains("ddprun_rendezvous_seconds"));
  CHECK(http_get(port, "/healthz").status == 200);
  CHECK(http_get(port, "/readyz").status == 200);
  l.signal(SIGTERM);
  auto r = l.finish(20s);
  CHECK(r.code == 128 + SIGTERM);
}

TEST_CASE("metrics: only GET of /metrics, /healthz and /readyz - a huge header is refused", "[ops]") {
  Launch l(cmd({"--standalone", "--metrics_port=0", "--nproc_per_node=1", kWorker, "ready", "block"}));
  int port = metrics_port(l);
  REQUIRE(l.wait_for("ready"));
  CHECK(http_get(port, "/nothing").status == 404);
  CHECK(http_raw(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").status == 405);
  CHECK(http_raw(port, "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n").status == 431);
  CHECK(http_get(port, "/healthz").status == 200);  // and it still serves
  l.signal(SIGTERM);
  l.finish(20s);
}

TEST_CASE("metrics: 200 idle and slow clients - the supervision is not delayed, the server recovers", "[ops]") {
  Launch l(cmd({"--standalone", "--metrics_port=0", "--nproc_per_node=1", kWorker, "pid", "block"}));
  int port = metrics_port(l);
  REQUIRE(l.wait_for("pid "));
  pid_t worker = std::stoi(l.out().substr(l.out().find("pid ") + 4));
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(connect_local(port));  // they send nothing
  int trickle = connect_local(port);
  ::send(trickle, "GET /met", 8, MSG_NOSIGNAL);  // and never finishes
  // The worker dies now: the agent sees it at once, whatever its metrics clients do.
  auto t0 = Clock::now();
  ::kill(worker, SIGKILL);
  auto r = l.finish(20s);
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  WARN("worker killed during a 200-client flood: ddprun exited " << took << " s later");
  CHECK(r.code == 128 + SIGKILL);
  CHECK(took < 1.0);
  for (int fd : idle) ::close(fd);
  ::close(trickle);

  // With a job running and 200 idle connections held open: a probe is answered at once (it takes
  // the place of the connection that waited longest), and the idle ones still in are cut off by
  // the 5 s deadline.
  Launch m(cmd({"--standalone", "--metrics_port=0", "--nproc_per_node=1", kWorker, "ready", "block"}));
  int port2 = metrics_port(m);
  REQUIRE(m.wait_for("ready"));
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(connect_local(port2));
  auto p0 = Clock::now();
  auto probe = http_get(port2, "/healthz");
  double probe_s = std::chrono::duration<double>(Clock::now() - p0).count();
  CHECK(probe.status == 200);
  CHECK(probe_s < 1.0);
  CHECK(closed_silently(flood.front(), 1s));  // pushed out, without an answer
  CHECK(closed_silently(flood.back(), 7s));   // still in: closed by the server at its 5 s deadline
  CHECK(http_get(port2, "/healthz").status == 200);
  for (int fd : flood) ::close(fd);
  m.signal(SIGTERM);
  m.finish(20s);
}

TEST_CASE("crash loop: the same rank failing the same way on consecutive attempts ends the job with 93", "[ops]") {
  auto dir = temp_dir();
  Launch l(cmd({"--standalone", "--nproc_per_node=2", "--max_restarts=5", "--max_same_failures=2",
                "--events_file=" + dir + "/events.jsonl", kWorker, "exit_if_rank:1:3", "block"}));
  auto r = l.finish(30s);
  INFO(r.err);
  CHECK(r.code == 93);
  CHECK_THAT(r.err, Catch::Contains("Crash loop: rank 1 failed the same way (exit code 3) on 2 consecutive attempts"));
  CHECK_THAT(r.err, Catch::Contains("ddprun exits with 93"));
  CHECK(Launch::occurrences(r.err, "restarting the worker group") == 1);  // one restart, not five
  CHECK_THAT(slurp(dir + "/events.jsonl"), Catch::Contains("\"event\":\"crash_loop\""));
  fs::remove_all(dir);
  SECTION("a failure that changes is not a loop: restarts run out as usual") {
    Launch c(cmd({"--standalone", "--nproc_per_node=1", "--max_restarts=2", "--max_same_failures=2", "--no_python",
                  "sh", "-c", "exit $((3 + TORCHELASTIC_RESTART_COUNT))"}));
    auto rc = c.finish(30s);
    INFO(rc.err);
    CHECK(rc.code == 5);
    CHECK_THAT(rc.err, !Catch::Contains("Crash loop"));
  }
}

TEST_CASE("torchrun 2.x flags: virtual local rank, duplicate filters, shutdown timeout, prefix template", "[ops]") {
  SECTION("--virtual-local-rank: LOCAL_RANK=0 and one device each, from CUDA_VISIBLE_DEVICES") {
    auto r = Launch(cmd({"--standalone", "--nproc_per_node=2", "--virtual-local-rank", "--no_python", "sh", "-c",
                         "echo RANK=$RANK LR=$LOCAL_RANK CVD=$CUDA_VISIBLE_DEVICES"}),
                    {{"CUDA_VISIBLE_DEVICES", "5,7"}})
                 .finish(20s);
    CHECK_THAT(r.out, Catch::Contains("RANK=0 LR=0 CVD=5") && Catch::Contains("RANK=1 LR=0 CVD=7"));
  }
  SECTION("--duplicate_stdout_filters copies matching lines to the attempt's filtered_stdout.log") {
    auto dir = temp_dir();
    auto r = Launch(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--nproc_per_node=2", "--rdzv_id=dup", "--log_dir=" + dir, "--duplicate_stdout_filters=apple,or,,ange",
                         "--no_python", "sh", "-c", "echo apple pie; echo banana; echo or,ange"}))
                 .finish(20s);
    REQUIRE(r.code == 0);
    auto copied = slurp(dir + "/dup/attempt_0/filtered_stdout.log");
    CHECK(Launch::occurrences(copied, "apple pie") == 2);
    CHECK(Launch::occurrences(copied, "or,ange") == 2);
    CHECK_THAT(copied, Catch::Contains("[default1]:apple pie") && !Catch::Contains("banana"));
    fs::remove_all(dir);
  }
  SECTION("--shutdown-timeout (and PET_SHUTDOWN_TIMEOUT) is the grace before SIGKILL") {
    auto spelled = GENERATE(std::string("flag"), std::string("pet"));
    std::vector<std::string> args = {"--standalone", "--nproc_per_node=1", "--stop_timeout=30", "--no_python", "sh", "-c",
                                     "trap '' TERM; echo ready; while :; do sleep 0.05; done"};
    std::map<std::string, std::string> env;
    if (spelled == "flag") args.insert(args.begin(), "--shutdown-timeout=0.5");
    if (spelled == "pet") env["PET_SHUTDOWN_TIMEOUT"] = "0.5";
    Launch l(cmd(args), env);
    REQUIRE(l.wait_for("ready"));
    l.signal(SIGTERM);  // forwarded: the worker ignores it
    auto r = l.finish(20s);
    INFO(r.err);
    CHECK(r.seconds < 10);  // not the 30 s of --stop_timeout
    CHECK_THAT(r.err, Catch::Contains("sending SIGKILL"));
  }
  SECTION("--log-line-prefix-template wins over TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") {
    auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--log-line-prefix-template=<${rank}|${role_name}>", "--no_python",
                         "echo", "hello"}),
                    {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "env:"}})
                 .finish(20s);
    CHECK_THAT(r.out, Catch::Contains("<0|default>hello"));
  }
}
