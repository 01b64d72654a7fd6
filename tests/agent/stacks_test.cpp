// Stacks of a hung group through the JobController and the real WorkerGroup, the fake runner
// playing the process tree: each worker's stack is read where its program really runs.
#include "controller_job.hpp"

using namespace ddprun::agent;
using namespace ddprun::agent::testing;
using namespace std::chrono_literals;

TEST_CASE("stacks: Python below a wrapper gets SIGABRT itself - a native program below one is read", "[controller]") {
  Job j(options(3, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  auto pids = j.pids();
  const pid_t python = 5001, native = 5002;
  j.runner.targets[pids[0]] = StackTargets{{python}, -1};  // sh -c 'python3 train.py; ...'
  j.runner.targets[pids[1]] = StackTargets{{}, native};    // bash train.sh -> /opt/train
  // pids[2]: the fake's default, a native worker read itself.
  j.over(0, RoundEnd::of_failure(Job::failure_on("node-b", 9, 124, true)));
  // The Python process is told, not the wrapper's whole group; a stopped one is woken for it.
  CHECK(j.runner.process_signals == std::vector<std::pair<pid_t, int>>{{python, SIGABRT}, {python, SIGCONT}});
  CHECK(j.runner.signals_to(pids[0]).empty());
  j.run_until([&] { return j.runner.stacks_read == 2; });
  std::sort(j.runner.stacks_of.begin(), j.runner.stacks_of.end());
  CHECK(j.runner.stacks_of == std::vector<pid_t>{pids[2], native});
  // The Python process died of its SIGABRT and its wrapper with it: the dump is complete.
  j.runner.exit(pids[0], 128 + SIGABRT);
  j.reap();
  j.run_until([&] { return !j.runner.signals_to(pids[1]).empty(); });
  CHECK(j.runner.signals_to(pids[1]) == std::vector<int>{SIGTERM});
  std::ifstream stack(j.root + "/ctl/attempt_0/1/stack.txt");
  std::string text((std::istreambuf_iterator<char>(stack)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("(pid 5002, started by worker pid " + std::to_string(pids[1]) + ")"));
  CHECK_THAT(text, Catch::Contains("wait_for_peer"));
}

TEST_CASE("stacks: a worker with several Python processes below it signals each of them", "[controller]") {
  Job j(options(1, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  auto pid = j.pids().at(0);
  j.runner.targets[pid] = StackTargets{{7001, 7002}, -1};
  j.over(0, RoundEnd::of_failure(Job::failure_on("node-b", 9, 124, true)));
  CHECK(j.runner.process_signals ==
        std::vector<std::pair<pid_t, int>>{{7001, SIGABRT}, {7001, SIGCONT}, {7002, SIGABRT}, {7002, SIGCONT}});
  CHECK(j.runner.stacks_read == 0);
}

TEST_CASE("stacks: the rank outside any collective is the one to blame, while others wait in one", "[stacks]") {
  std::vector<StackFrame> waiting = {{"std::__basic_future<void>::_M_get_result() const", "", 0},
                                     {"ddprun::runtime::FutureWork::wait()", "comm_thread.hpp", 22},
                                     {"ddprun::runtime::Reducer::Impl::wait_all()", "reducer.cpp", 250},
                                     {"main", "train.cpp", 90}};
  std::vector<StackFrame> in_gloo = {{"gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, std::ratio<1l, 1000l> >)", "", 0},
                                     {"main", "train.cpp", 80}};
  std::vector<StackFrame> python = {{"wait", "distributed_c10d.py", 4000}, {"<module>", "train.py", 9}};
  std::vector<StackFrame> loading = {{"load_batch", "data.cpp", 17}, {"main", "train.cpp", 70}};
  CHECK(in_collective(waiting));
  CHECK(in_collective(in_gloo));
  CHECK(in_collective(python));
  CHECK_FALSE(in_collective(loading));
  auto blamed = rank_outside_collectives({{0, waiting}, {1, in_gloo}, {2, loading}, {3, python}});
  REQUIRE(blamed);
  CHECK(blamed->rank == 2);
  CHECK(blamed->where == "load_batch (data.cpp:17) <- main (train.cpp:70)");
  CHECK(blamed->waiting == std::vector<int>{0, 1, 3});
  // Nobody to blame: all inside (a network stall), all outside, or unread stacks only.
  CHECK_FALSE(rank_outside_collectives({{0, waiting}, {1, in_gloo}}));
  CHECK_FALSE(rank_outside_collectives({{0, loading}, {1, loading}}));
  CHECK_FALSE(rank_outside_collectives({{0, waiting}, {1, {}}}));
}

TEST_CASE("stacks: a warm worker's dump leaves out the spare driver's frames - grouped with a cold rank at the same line",
          "[stacks]") {
  // Ranks 0 and 1 stuck at the same line; rank 1 runs in a warm spare, below its driver.
  const std::string cold =
      "Fatal Python error: Aborted\n\n"
      "Current thread 0x00007f965601eb80 (most recent call first):\n"
      "  File \"/job/train.py\", line 5 in wait_for_peer\n"
      "  File \"/job/train.py\", line 8 in train_step\n"
      "  File \"/job/train.py\", line 11 in <module>\n";
  const std::string warm =
      "Fatal Python error: Aborted\n\n"
      "Thread 0x00007f96551d66c0 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n\n"
      "Current thread 0x00007f965601eb80 (most recent call first):\n"
      "  File \"/job/train.py\", line 5 in wait_for_peer\n"
      "  File \"/job/train.py\", line 8 in train_step\n"
      "  File \"/job/train.py\", line 11 in <module>\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 135 in _run\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 176 in <module>\n";
  const auto c = parse_python_stack(cold), w = parse_python_stack(warm);
  REQUIRE(w.size() == 3);
  CHECK(w.back().function == "<module>");
  CHECK(w.back().file == "train.py");
  CHECK(describe_frames(w) == describe_frames(c));
  CHECK(describe_frames(w, 5) == "wait_for_peer (train.py:5) <- train_step (train.py:8) <- <module> (train.py:11)");
  CHECK(summarize_stacks({{0, c}, {1, w}, {2, w}}) ==
        "  ranks 0,1,2: wait_for_peer (train.py:5) <- train_step (train.py:8) <- <module> (train.py:11)\n");
  // -m module: the runpy frames of a cold `python -m` stay, as in the cold rank's stack.
  const std::string warm_m =
      "Current thread 0x00007f965601eb80 (most recent call first):\n"
      "  File \"/job/pkg/train.py\", line 5 in wait_for_peer\n"
      "  File \"/usr/lib/python3.11/runpy.py\", line 88 in _run_code\n"
      "  File \"/usr/lib/python3.11/runpy.py\", line 198 in _run_module_as_main\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 121 in _run\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 176 in <module>\n";
  CHECK(describe_frames(parse_python_stack(warm_m), 9) ==
        "wait_for_peer (train.py:5) <- _run_code (runpy.py:88) <- _run_module_as_main (runpy.py:198)");
}

TEST_CASE("stacks: the stack.txt of a warm worker holds no driver frame below the script - one stuck in the driver keeps them",
          "[stacks]") {
  const std::string warm =
      "Current thread 0x00007f965601eb80 (most recent call first):\n"
      "  File \"/job/train.py\", line 11 in <module>\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 135 in _run\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 176 in <module>\n";
  CHECK(without_spare_driver(warm) ==
        "Current thread 0x00007f965601eb80 (most recent call first):\n"
        "  File \"/job/train.py\", line 11 in <module>\n");
  // Before the script ran (reading its order): the driver is all there is, and is kept.
  const std::string waiting =
      "Current thread 0x00007f965601eb80 (most recent call first):\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 70 in _read_order\n"
      "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 168 in _spare\n";
  CHECK(without_spare_driver(waiting) == waiting);
  auto frames = parse_python_stack(waiting);
  REQUIRE(frames.size() == 2);
  CHECK(frames[0].function == "_read_order");
  const std::string cold = "Current thread 0x1 (most recent call first):\n  File \"/job/train.py\", line 1 in <module>";
  CHECK(without_spare_driver(cold) == cold);
}

TEST_CASE("stacks: a failure summary's stderr tail holds no driver frame below the script", "[stacks]") {
  // The tail may begin inside a dump: its header cut off.
  std::deque<std::string> tail = {"  File \"/job/train.py\", line 6 in stuck",
                                  "  File \"/job/train.py\", line 13 in <module>",
                                  "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 135 in _run",
                                  "  File \"/usr/share/ddprun/python/_ddprun_spare.py\", line 176 in <module>",
                                  "",
                                  "Extension modules: torch._C (total: 1)"};
  CHECK(without_spare_driver(tail) == std::deque<std::string>{"  File \"/job/train.py\", line 6 in stuck",
                                                              "  File \"/job/train.py\", line 13 in <module>", "",
                                                              "Extension modules: torch._C (total: 1)"});
}
