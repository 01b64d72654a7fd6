// Start-up is not a hang: --worker_timeout counts from a worker's first heartbeat, and
// --worker_start_timeout bounds the time before it (the built ddprun, test_worker as the worker).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "e2e/agents.hpp"

using namespace ddprun::test;

TEST_CASE("start-up: a worker that sleeps 2x --worker_timeout before its first heartbeat runs to completion",
          "[heartbeat]") {
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=2", "--worker_timeout=0.5", kWorker, "sleep:1000",
                       "heartbeat:6:100"}))
               .finish(30s);
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.seconds > 1.0);
}

TEST_CASE("start-up: a worker that hangs after its first heartbeat is caught by --worker_timeout", "[heartbeat]") {
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.5", "--stack_dump_timeout=0",
                       kWorker, "sleep:1000", "heartbeat:2:50", "block"}))
               .finish(30s);
  INFO(r.err);
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("no heartbeat for"));
  CHECK_THAT(r.err, Catch::Contains("(--worker_timeout=0.5)"));
  CHECK(r.seconds < 10);
}

TEST_CASE("start-up: a worker that never beats is caught by --worker_start_timeout", "[heartbeat]") {
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.3", "--worker_start_timeout=1.5",
                       "--stack_dump_timeout=0", kWorker, "block"}))
               .finish(30s);
  INFO(r.err);
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("no first heartbeat within"));
  CHECK_THAT(r.err, Catch::Contains("--worker_start_timeout=1.5"));
  CHECK(r.seconds >= 1.5);  // not at --worker_timeout
  CHECK(r.seconds < 10);
}

TEST_CASE("start-up: --worker_start_timeout is in the option table (help, PET_ form, checked)", "[heartbeat]") {
  auto help = Launch(cmd({"--help"})).finish(10s);
  CHECK_THAT(help.out, Catch::Contains("--worker_start_timeout"));
  CHECK_THAT(help.out, Catch::Contains("1800"));
  auto pet = Launch(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.3", "--stack_dump_timeout=0",
                         kWorker, "block"}),
                    {{"PET_WORKER_START_TIMEOUT", "0.5"}})
                 .finish(30s);
  CHECK(pet.code == 124);
  CHECK_THAT(pet.err, Catch::Contains("--worker_start_timeout=0.5"));
  auto bad = Launch(cmd({"--worker_start_timeout=-2", kWorker})).finish(10s);
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--worker_start_timeout must be a non-negative number of seconds"));
}

// The agent's own start-up (README: Start-up cost): a single node's store is listening from the
// start but starts its thread at its first client, so a launch whose workers never use it (not
// PyTorch) neither starts nor stops one. The worker counts its agent's threads.
TEST_CASE("start-up: the workers' store starts its thread at its first client, and serves it", "[e2e]") {
  const std::string count = "ls /proc/$PPID/task | wc -l";
  auto none = Launch(cmd({"--standalone", "--nproc_per_node=1", "/bin/sh", "-c", count})).finish(30s);
  INFO(none.out << none.err);
  REQUIRE(none.code == 0);
  CHECK_THAT(none.out, Catch::Contains("[default0]:1\n"));  // the agent alone: no store thread
  auto used = Launch(cmd({"--standalone", "--nproc_per_node=1", "/bin/sh", "-c",
                          "\"$0\" store_set:k >/dev/null && " + count, kWorker}))
                  .finish(30s);
  INFO(used.out << used.err);
  REQUIRE(used.code == 0);  // the client's SET was served
  CHECK_THAT(used.out, Catch::Contains("[default0]:2\n"));  // and the store's thread runs
}

// ddprun marks a job it hands to ddprun-full (launcher/full_program.hpp) in the environment; the
// mark is taken off first thing, so a worker never sees it, even one a user set by hand.
TEST_CASE("start-up: the hand-off mark never reaches a worker", "[e2e]") {
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "/bin/sh", "-c", "echo mark=${DDPRUN_HANDED_OFF-none}"}),
                  {{"DDPRUN_HANDED_OFF", "1"}})
               .finish(30s);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[default0]:mark=none"));
}

// On a machine of many cores a group is started from several threads (agent/src/spawn_pool.hpp);
// DDPRUN_SPAWN_THREADS=4 asks for that here. Every rank starts once per attempt with its own
// environment; the threads outlive their workers' start (a worker's PR_SET_PDEATHSIG fires when
// the thread that started it ends: these sleep first, so an early end would kill them), and the
// restart starts the new group from the same threads.
TEST_CASE("start-up: a group started from 4 threads: every rank once, alive past its start, and a restart", "[e2e]") {
  const std::string script =
      "sleep 0.3; echo \"a=$TORCHELASTIC_RESTART_COUNT r=$RANK w=$WORLD_SIZE t=$(ls /proc/$PPID/task | wc -l)\"; "
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 3; fi";
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=32", "--max_restarts=1", "/bin/sh", "-c", script}),
                  {{"DDPRUN_SPAWN_THREADS", "4"}})
               .finish(60s);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  for (int rank = 0; rank < 32; ++rank) {
    // The agent's threads: its loop's, the 3 that start workers beside it, and at times the
    // console writer's (no store thread: the workers never use the store).
    INFO("rank " << rank);
    CHECK(std::regex_search(r.out, std::regex("a=1 r=" + std::to_string(rank) + " w=32 t=[45]\n")));
  }
  CHECK(std::regex_search(r.out, std::regex("a=0 r=1 w=32 t=[45]\n")));
}

// The agent sizes its descriptor table for the job before it has a second thread (agent.cpp,
// reserve_descriptors): a table grown later, in a process of several threads, waits for an RCU
// grace period each time (20-30 ms on 16 CPUs). 8 workers use fewer than 64 descriptors, so the
// larger table the worker sees was made on purpose; one worker's job keeps the table every
// process starts with (64).
TEST_CASE("start-up: the agent's descriptor table is sized for the job before any thread", "[e2e]") {
  // Descriptors above 63 inherited from whatever started this test would size the table already.
  std::vector<int> high;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::atoi(e.path().filename().c_str());
    if (fd >= 64) high.push_back(fd);
  }
  for (int fd : high) ::close(fd);
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=8", "/bin/sh", "-c",
                       "[ \"$RANK\" = 0 ] && grep FDSize /proc/$PPID/status; true"}))
               .finish(30s);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(std::regex_search(r.out, std::regex("\\[default0\\]:FDSize:\\s+128\\n")));  // 4 * 8 + 48 = 80 slots
  auto one = Launch(cmd({"--standalone", "--nproc_per_node=1", "/bin/sh", "-c", "grep FDSize /proc/$PPID/status"}))
                 .finish(30s);
  CHECK(std::regex_search(one.out, std::regex("\\[default0\\]:FDSize:\\s+64\\n")));
}
