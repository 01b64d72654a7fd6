// The event log (--events_file): JSON Lines written as things happen, in the documented order,
// every event with ts, host and run_id.

#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e/agents.hpp"

using namespace ddprun::test;
using json = nlohmann::json;

namespace {

std::string events_path() {
  char tmpl[] = "/tmp/ddprun-events-XXXXXX";
  int fd = ::mkstemp(tmpl);
  ::close(fd);
  ::unlink(tmpl);
  return tmpl;
}

std::vector<json> read_events(const std::string& path) {
  std::vector<json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    auto j = json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    for (const char* k : {"event", "ts", "host", "run_id"}) REQUIRE(j.contains(k));
    out.push_back(j);
  }
  ::unlink(path.c_str());
  return out;
}

std::vector<std::string> names(const std::vector<json>& ev) {
  std::vector<std::string> out;
  for (const auto& e : ev) out.push_back(e["event"]);
  return out;
}

}  // namespace

TEST_CASE("event log of a crash and a restart: documented order and fields", "[events]") {
  auto path = events_path();
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--events_file=" + path, kWorker,
                       "fail_before_attempt:1:3"}))
               .finish(60s);
  REQUIRE(r.code == 0);
  auto ev = read_events(path);
  // One node is a rendezvous of one: every attempt is a round, as on several nodes.
  CHECK(names(ev) == std::vector<std::string>{"job_started", "rendezvous_complete", "workers_started", "worker_failed",
                                              "restart", "rendezvous_complete", "workers_started", "recovery",
                                              "job_finished"});
  REQUIRE(ev.size() == 9);
  CHECK(ev[0]["nproc_per_node"] == 2);
  CHECK(ev[1]["world_size"] == 2);
  CHECK(ev[2]["attempt"] == 0);
  CHECK(ev[2]["ranks"] == json::array({0, 1}));
  CHECK(ev[2]["pids"].size() == 2);
  CHECK(ev[3]["rank"] == 1);
  CHECK(ev[3]["reason"] == "exit");
  CHECK(ev[3]["exit_code"] == 3);
  CHECK(ev[3]["pid"] == ev[2]["pids"][1]);
  CHECK(ev[4]["count"] == 1);
  CHECK(ev[5]["round"] == 1);
  CHECK(ev[6]["attempt"] == 1);
  CHECK(ev[7]["attempt"] == 1);  // the restart, timed by phase (these workers never beat: no ready time)
  CHECK(ev[7]["total_s"].get<double>() >= 0);
  CHECK(ev[7]["spawn_s"].get<double>() >= 0);
  CHECK(ev[7]["cold"] == 2);
  CHECK(ev[8]["exit_code"] == 0);
  for (const auto& e : ev) CHECK(e["run_id"] == ev[0]["run_id"]);
}

TEST_CASE("event log: a hang and a signal are told apart from an exit", "[events]") {
  SECTION("hang") {
    auto path = events_path();
    auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.5", "--stop_timeout=1",
                         "--events_file=" + path, kWorker, "heartbeat:2:50", "block"}))
                 .finish(60s);
    CHECK(r.code == 124);
    auto ev = read_events(path);
    REQUIRE(ev.size() == 6);
    CHECK(ev[3]["event"] == "hang_reported");  // where the hung rank was, before it was stopped
    CHECK(ev[3]["stacks"].contains("0"));
    CHECK(ev[3]["rank"] == 0);
    CHECK(ev[4]["event"] == "worker_failed");
    CHECK(ev[4]["reason"] == "hang");
    CHECK(ev[4]["exit_code"].is_null());
    CHECK(ev[5]["event"] == "job_finished");
    CHECK(ev[5]["exit_code"] == 124);
  }
  SECTION("signal") {
    auto path = events_path();
    auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--events_file=" + path, kWorker, "signal:SEGV"}))
                 .finish(60s);
    CHECK(r.code == 128 + SIGSEGV);
    auto ev = read_events(path);
    REQUIRE(ev.size() == 5);
    CHECK(ev[3]["reason"] == "signal");
    CHECK(ev[3]["signal"] == SIGSEGV);
  }
}
