// Stacks of hung ranks: a C++ worker and a Python worker, each stuck in a named function, are
// found hung by their heartbeats; ddprun prints where every rank is stuck (identical stacks
// grouped), writes the full dumps to each rank's stack.txt, and only then stops them.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "e2e/agents.hpp"
#include "skip.hpp"

using namespace ddprun::test;
using json = nlohmann::json;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The state letters of `pid`'s threads, from /proc (a 'D': in uninterruptible sleep; 'T': stopped).
std::string thread_states(pid_t pid) {
  std::string states;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const std::string stat = slurp(t.path().string() + "/stat");
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size()) states += stat[paren + 2];
  }
  return states;
}

// A process whose main thread and four others sleep while one more sits in vfork() for `seconds` (state
// D: it takes no signal until the child exits), as a worker's helper thread in a driver call or on
// a network file system.
pid_t with_thread_in_d(int seconds) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int i = 0; i < 4; ++i) std::thread([] { for (;;) ::pause(); }).detach();  // threads read beside it
    std::thread([seconds] {
      if (::vfork() == 0) {
        struct timespec t {seconds, 0};
        ::syscall(SYS_nanosleep, &t, nullptr);
        ::syscall(SYS_exit_group, 0);
      }
      for (;;) ::pause();
    }).detach();
    for (;;) ::pause();
  }
  return pid;
}

}  // namespace

TEST_CASE("stacks: a C++ worker stuck in a named function - every rank's stack, grouped, before the kill", "[stacks]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/eu-stack") || std::filesystem::exists("/usr/bin/gdb"),
              "neither eu-stack nor gdb is installed (scripts/setup.sh installs elfutils)");
  auto dir = temp_dir();
  auto events = dir + "/events.jsonl";
  auto r = Launch(cmd({"--nproc_per_node=2", "--master_port=0", "--rdzv_id=hung", "--worker_timeout=0.5",
                       "--stop_timeout=1", "--log_dir=" + dir, "--events_file=" + events, kWorker, "heartbeat:2:50", "stuck"}))
               .finish(60s);
  CHECK(r.code == 124);
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("ddprun: hang on"));
  CHECK_THAT(r.err, Catch::Contains("ranks 0-1 [sleeping]: ddprun_test_stuck_in_all_reduce (test_worker.cpp:"));
  CHECK_THAT(r.err, Catch::Contains("<- ddprun_test_train_step"));
  for (const char* rank : {"0", "1"}) {
    auto text = slurp(dir + "/hung/attempt_0/" + rank + "/stack.txt");
    CHECK_THAT(text, Catch::Contains("ddprun_test_stuck_in_all_reduce"));
    CHECK_THAT(text, Catch::Contains("main"));
  }
  std::ifstream ev(events);
  std::vector<std::string> names;
  for (std::string l; std::getline(ev, l);) {
    auto j = json::parse(l);
    names.push_back(j["event"]);
    if (j["event"] == "hang_reported") {
      CHECK(j["files"].size() == 2);
      CHECK_THAT(j["stacks"]["1"].get<std::string>(), Catch::Contains("ddprun_test_stuck_in_all_reduce"));
    }
  }
  // The hang's report (every rank's stack, read without stopping any), then the failure, then
  // the end; the stacks are not read twice.
  auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  CHECK(at("hang_reported") < at("worker_failed"));
  CHECK(at("worker_failed") < at("job_finished"));
  CHECK(at("job_finished") < static_cast<long>(names.size()));
  CHECK(std::count(names.begin(), names.end(), "stacks_dumped") == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("stacks: a Python worker stuck in a named function - its traceback, via the hook's stack signal, no crash banner", "[stacks]") {
  auto dir = temp_dir();
  auto script = dir + "/train.py";
  std::ofstream(script) << "import os, time\n"
                           "def stuck_in_all_reduce():\n"
                           "    while True:\n"
                           "        time.sleep(0.05)\n"
                           "def train_step():\n"
                           "    stuck_in_all_reduce()\n"
                           "def beating():\n"
                           "    while True:\n"
                           "        os.utime(os.environ['DDPRUN_HEARTBEAT_FILE'])\n"
                           "        time.sleep(0.05)\n"
                           "os.utime(os.environ['DDPRUN_HEARTBEAT_FILE'])\n"
                           "if os.environ['RANK'] == '1':\n"
                           "    train_step()\n"
                           "beating()\n";
  auto r = Launch(cmd({"--nproc_per_node=2", "--master_port=0", "--rdzv_id=py", "--worker_timeout=1",
                       "--stop_timeout=1", "--log_dir=" + dir, script}))
               .finish(60s);
  CHECK(r.code == 124);
  INFO(r.err);
  // Rank 1 missed its heartbeats; rank 0 was beating, in its loop: both stacks are shown.
  CHECK_THAT(r.err, Catch::Contains("]: stuck_in_all_reduce (train.py:4) <- train_step (train.py:6) <- <module> (train.py:13)"));
  CHECK_THAT(r.err, Catch::Contains("rank 0 [sleeping"));
  // Rank 0 may be caught beating (line 9) or sleeping (line 10): its loop is one function.
  CHECK_THAT(r.err, Catch::Contains("]: beating (train.py:9) <- <module> (train.py:14)") ||
                        Catch::Contains("]: beating (train.py:10) <- <module> (train.py:14)"));
  auto text = slurp(dir + "/py/attempt_0/1/stack.txt");
  CHECK_THAT(text, !Catch::Contains("Fatal Python error"));  // read without ending it
  CHECK_THAT(text, Catch::Contains("in stuck_in_all_reduce"));
  CHECK_THAT(r.err, !Catch::Contains("Fatal Python error"));
  std::filesystem::remove_all(dir);
}

namespace {

// The warm spare (_ddprun_spare.py) of local rank `local_rank` whose environment holds `tag`.
pid_t spare_of(int local_rank, const std::string& tag) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (slurp("/proc/" + pid + "/cmdline").find("_ddprun_spare.py") == std::string::npos) continue;
    std::string env = slurp("/proc/" + pid + "/environ");
    env.insert(0, 1, '\0');
    if (env.find(std::string(1, '\0') + "DDPRUN_TEST_TAG=" + tag + '\0') != std::string::npos &&
        env.find(std::string(1, '\0') + "LOCAL_RANK=" + std::to_string(local_rank) + '\0') != std::string::npos) {
      return static_cast<pid_t>(std::stol(pid));
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("stacks: a warm and a cold rank stuck at the same line group together - no frame of the spare's driver",
          "[stacks][spares]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/python3"), "no /usr/bin/python3");
  auto dir = temp_dir();
  auto script = dir + "/train.py", go = dir + "/go";
  std::ofstream(script) << "import os, sys, time\n"
                           "def beat():\n"
                           "    os.utime(os.environ['DDPRUN_HEARTBEAT_FILE'])\n"
                           "def stuck():\n"
                           "    while True:\n"
                           "        time.sleep(0.05)\n"
                           "beat()\n"
                           "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                           "    while not os.path.exists(sys.argv[1]):\n"
                           "        beat()\n"
                           "        time.sleep(0.05)\n"
                           "    sys.exit(3 if os.environ['RANK'] == '0' else 0)\n"
                           "stuck()\n";
  Launch l(cmd({"--nproc_per_node=2", "--master_port=0", "--rdzv_id=warm", "--max_restarts=1", "--worker_timeout=1",
                "--stop_timeout=1", "--log_dir=" + dir, script, go}),
           {{"PYTHON_EXEC", "/usr/bin/python3"}, {"DDPRUN_TEST_TAG", dir}});
  // Both spares ready; local rank 1's killed, so that rank 1 of the next attempt starts cold.
  // (Spares start at nice 19: beside busy tests on 2 cores that took over 30 s once in a fresh
  // clone's suite; here they are what the case needs, not what it measures.)
  auto deadline = Clock::now() + 75s;
  while (Launch::occurrences(l.err(), "warm spare for local rank") < 2 && Clock::now() < deadline) {
    l.wait_for("\x01", 1, 50ms);
  }
  INFO("ddprun said so far:\n" << l.err());
  REQUIRE(Launch::occurrences(l.err(), "warm spare for local rank") >= 2);
  const pid_t spare = spare_of(1, dir);
  REQUIRE(spare > 0);
  ::kill(spare, SIGKILL);
  std::ofstream(go) << "go\n";
  auto r = l.finish(60s);
  INFO(r.err);
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("(1 warm, 1 cold)"));
  CHECK_THAT(r.err, Catch::Contains("ranks 0-1 [sleeping]: stuck (train.py:6) <- <module> (train.py:13)\n"));
  const auto summary = r.err.substr(r.err.find("ddprun: job failed"));
  CHECK_THAT(summary, !Catch::Contains("_ddprun_spare.py"));
  auto text = slurp(dir + "/warm/attempt_1/0/stack.txt");
  CHECK_THAT(text, Catch::Contains("in stuck"));
  CHECK_THAT(text, !Catch::Contains("_ddprun_spare.py"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("spares: a single node's last allowed attempt, or a job with --max_restarts=0, makes none", "[spares]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/python3"), "no /usr/bin/python3");
  auto dir = temp_dir();
  auto script = dir + "/train.py";
  // Beats (the group is up: spares are due), then runs 2 s more; attempt 0 of rank 0 then fails once.
  std::ofstream(script) << "import os, sys, time\n"
                           "for _ in range(40):\n"
                           "    os.utime(os.environ['DDPRUN_HEARTBEAT_FILE'])\n"
                           "    time.sleep(0.05)\n"
                           "sys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and os.environ['RANK'] == '0'"
                           " and sys.argv[1] == 'fail' else 0)\n";
  const std::map<std::string, std::string> env{{"PYTHON_EXEC", "/usr/bin/python3"}, {"DDPRUN_TEST_TAG", dir}};
  // One restart allowed: attempt 0's spares take attempt 1 over; attempt 1, the last, makes none.
  auto once = Launch(cmd({"--standalone", "--nproc_per_node=2", "--max_restarts=1", script, "fail"}), env).finish(60s);
  INFO(once.err);
  CHECK(once.code == 0);
  CHECK_THAT(once.err, Catch::Contains("(2 warm)"));
  CHECK(Launch::occurrences(once.err, "warm spare for local rank") == 2);
  // No restart allowed: no spare at all.
  auto never = Launch(cmd({"--standalone", "--nproc_per_node=2", "--max_restarts=0", script, "ok"}), env).finish(60s);
  INFO(never.err);
  CHECK(never.code == 0);
  CHECK(Launch::occurrences(never.err, "warm spare for local rank") == 0);
  std::filesystem::remove_all(dir);
}

// The text after `mark` up to `end` ("" where `mark` is missing).
std::string after(const std::string& text, const std::string& mark, char end) {
  const auto at = text.find(mark);
  if (at == std::string::npos) return std::string();
  const auto from = at + mark.size();
  return text.substr(from, text.find(end, from) - from);
}

// ddprun's temporary directory, from a worker's DDPRUN_HEARTBEAT_FILE (ddprun-X/RUN_ID/attempt_0/...).
std::string temp_root(const std::string& out) {
  const auto file = after(out, "DDPRUN_HEARTBEAT_FILE=", '\n');
  const auto at = file.find("/attempt_");
  return at == std::string::npos ? std::string() : std::filesystem::path(file.substr(0, at)).parent_path().string();
}

const std::string kDumps = "(full dumps: ", kKept = "the workers' stack dumps are kept in ";

TEST_CASE("stacks: without --log_dir the dumps a hang report names are copied beside the temporary directory, which goes, and ddprun says where", "[stacks]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/eu-stack") || std::filesystem::exists("/usr/bin/gdb"),
              "neither eu-stack nor gdb is installed (scripts/setup.sh installs elfutils)");
  // A one-rank hang with TMPDIR as given ("": unset); the result removes the dumps it kept in /tmp.
  auto hang = [](const std::string& tmpdir) {
    auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.5", "--stop_timeout=1", kWorker,
                         "env", "heartbeat:2:50", "stuck"}),
                    {{"TMPDIR", tmpdir}})
                 .finish(60s);
    CHECK(r.code == 124);
    return r;
  };
  // The report's dump, in the directory the end names, and the temporary directory gone.
  auto check = [](const Result& r, const std::string& where) {
    INFO(r.out << r.err);
    const auto file = after(r.err, kDumps, ')'), kept = after(r.err, kKept, ' ');
    REQUIRE_FALSE(kept.empty());
    CHECK(kept.rfind(where + "/ddprun-stacks-", 0) == 0);
    CHECK(file == kept + "/attempt_0/0/stack.txt");
    CHECK_THAT(slurp(file), Catch::Contains("ddprun_test_stuck_in_all_reduce"));
    const auto root = temp_root(r.out);
    CHECK_FALSE(root.empty());
    CHECK_FALSE(std::filesystem::exists(root));
  };

  auto tmp = temp_dir();
  check(hang(tmp), tmp);
  std::filesystem::remove_all(tmp);

  // Without TMPDIR the temporary directory is in memory (/dev/shm): the dumps go to /tmp.
  const auto run = hang("");
  check(run, "/tmp");
  CHECK(run.kept_dumps);
}

TEST_CASE("stacks: the dumps a hang report names outlive an agent killed after it (kill -9: its guardian removes the temporary directory)", "[stacks]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/eu-stack") || std::filesystem::exists("/usr/bin/gdb"),
              "neither eu-stack nor gdb is installed (scripts/setup.sh installs elfutils)");
  Launch l(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=auto", "--hang_floor=0.5", "--hang_stop=60",
                kWorker, "env", "heartbeat:2:50", "stuck"}));
  const auto deadline = Clock::now() + 30s;
  while (Clock::now() < deadline && l.err().find("the workers still run") == std::string::npos) {
    l.wait_for("\x01", 1, 50ms);  // pumps both streams for a moment
  }
  const auto file = after(l.err(), kDumps, ')');
  const auto root = temp_root(l.out());
  INFO(l.out() << l.err());
  REQUIRE(file.rfind("/tmp/ddprun-stacks-", 0) == 0);
  REQUIRE_FALSE(root.empty());
  l.signal(SIGKILL);
  l.finish(10s);
  for (auto until = Clock::now() + 10s; std::filesystem::exists(root) && Clock::now() < until;) {
    std::this_thread::sleep_for(20ms);  // the guardian's removal, after the agent's death
  }
  CHECK_FALSE(std::filesystem::exists(root));
  CHECK_THAT(slurp(file), Catch::Contains("ddprun_test_stuck_in_all_reduce"));
  std::filesystem::remove_all(file.substr(0, file.find("/attempt_")));
}

TEST_CASE("stacks: --stack_dump_timeout=0 stops a hung group at once, without stacks (states only, no dump kept)", "[stacks]") {
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.3", "--stop_timeout=1",
                       "--stack_dump_timeout=0", kWorker, "heartbeat:2:50", "stuck"}))
               .finish(60s);
  INFO(r.err);
  CHECK(r.code == 124);
  CHECK_THAT(r.err, !Catch::Contains("stacks of the workers"));
  CHECK_THAT(r.err, Catch::Contains("reading every rank's state (no stacks: --stack_dump_timeout=0)"));
  CHECK_THAT(r.err, Catch::Contains("]: (no stack: --stack_dump_timeout=0)"));
  CHECK_THAT(r.err, !Catch::Contains("full dumps") && !Catch::Contains("dumps are kept"));
}

TEST_CASE("stacks: a hang on one node makes every node dump its own workers' stacks", "[stacks][multinode]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/eu-stack") || std::filesystem::exists("/usr/bin/gdb"),
              "neither eu-stack nor gdb is installed (scripts/setup.sh installs elfutils)");
  // Node 0's workers beat for a long time; node 1's rank hangs in a named function.
  std::string conf = "--rdzv_conf=join_timeout=30,last_call_timeout=30";
  Launch n0(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=hang2", conf,
                 "--nproc_per_node=1", "--worker_timeout=5", "--stop_timeout=1", kWorker, "heartbeat:1000:50"}));
  auto port = host_port(n0);
  Launch n1(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=hang2",
                 conf, "--nproc_per_node=1", "--worker_timeout=0.5", "--stop_timeout=1", kWorker, "heartbeat:2:50",
                 "stuck"}));
  auto r1 = n1.finish(60s);
  auto r0 = n0.finish(60s);
  INFO(r0.err << "\n----\n" << r1.err);
  CHECK(r0.code == 124);
  CHECK(r1.code == 124);
  CHECK_THAT(r1.err, Catch::Contains("ddprun: hang on"));
  CHECK_THAT(r1.err, Catch::Contains("]: ddprun_test_stuck_in_all_reduce"));
  // The healthy node shows where its rank was when the other one hung.
  CHECK_THAT(r0.err, Catch::Contains("stacks of the workers on"));
  CHECK_THAT(r0.err, Catch::Contains("rank 0: "));
}

TEST_CASE("stacks: ddprun-stack leaves a process with a thread in uninterruptible sleep running - killed midway, or naming that thread after 1 s", "[stacks]") {
  const std::string tool = std::filesystem::path(DDPRUN_BIN).parent_path() / "ddprun-stack";
  SKIP_UNLESS(std::filesystem::exists(tool), "ddprun-stack was not built (libdw-dev missing: scripts/setup.sh installs it)");
  auto until = [](auto cond, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!cond() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return cond();
  };
  for (const bool killed : {true, false}) {
    INFO((killed ? "killed midway (as the agent does at --stack_dump_timeout)" : "left to finish"));
    const pid_t target = with_thread_in_d(6);
    REQUIRE(until([&] { return thread_states(target).find('D') != std::string::npos; }, std::chrono::seconds(5)));
    Launch reader({tool, std::to_string(target)});
    if (killed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      reader.signal(SIGKILL);
      reader.finish();
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = reader.finish();
      CHECK(r.code == 0);
      CHECK_THAT(r.out, Catch::Contains("TID " + std::to_string(target) + ":\n#0 ") &&
                            Catch::Contains("(not read: it did not stop within 1000 ms: in uninterruptible sleep (D))"));
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(5000));
    }
    // Once the thread leaves D, nothing is left pending that would stop the process.
    CHECK(until([&] { return thread_states(target).find('D') == std::string::npos; }, std::chrono::seconds(10)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string states = thread_states(target);
    INFO("thread states after: " << states);
    CHECK(states.find('T') == std::string::npos);
    CHECK(states.find('t') == std::string::npos);
    ::kill(target, SIGKILL);
    ::waitpid(target, nullptr, 0);
  }
  // The process killed while it is read (its main thread stopped, the other awaited): the reader
  // ends, saying so, and does not abort (libdw asserts when a thread it read no registers of is
  // followed by another).
  const pid_t target = with_thread_in_d(3);
  REQUIRE(until([&] { return thread_states(target).find('D') != std::string::npos; }, std::chrono::seconds(5)));
  Launch reader({tool, std::to_string(target)});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(target, SIGKILL);
  auto r = reader.finish(std::chrono::seconds(10));
  ::waitpid(target, nullptr, 0);
  INFO(r.out << r.err);
  CHECK((r.code == 0 || r.code == 1));
  CHECK_THAT(r.out, Catch::Contains("PID " + std::to_string(target)));
}
