// Unit tests of the agent's small pieces: exit statuses, line splitting, error files, stacks.

#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "observe/failure_report.hpp"
#include "workers/output.hpp"
#include "observe/stack_dump.hpp"

using namespace ddprun;
using namespace ddprun::agent;

TEST_CASE("exit statuses map to shell codes like srun", "[units]") {
  auto exited = ExitStatus::from_wait_status(3 << 8);
  CHECK(exited.code == 3);
  CHECK(exited.shell_code() == 3);
  CHECK(exited.describe() == "exit code 3");
  ExitStatus killed;
  killed.signal = SIGKILL;
  CHECK(killed.shell_code() == 137);
  CHECK(killed.describe() == "signal SIGKILL (9)");
  CHECK(parse_signal("SIGUSR1") == SIGUSR1);
  CHECK(parse_signal("USR2") == SIGUSR2);
  CHECK(parse_signal("15") == SIGTERM);
  CHECK(parse_signal("SIGNOPE") == 0);
  CHECK(signal_name(SIGSEGV) == "SIGSEGV");
}

TEST_CASE("the line splitter yields whole lines and cuts runaway ones", "[units]") {
  LineSplitter s;
  std::vector<std::string> got;
  auto sink = [&](std::string_view l) { got.emplace_back(l); };
  s.feed("ab", sink);
  s.feed("c\nde", sink);
  s.feed("f\n\ng", sink);
  CHECK(got == std::vector<std::string>{"abc", "def", ""});
  s.finish(sink);
  CHECK(got.back() == "g");
  got.clear();
  s.feed(std::string(LineSplitter::kMaxLine + 10, 'x'), sink);
  CHECK(got.size() == 1);
  CHECK(got[0].size() == LineSplitter::kMaxLine);
  s.finish(sink);
  CHECK(got[1].size() == 10);
  got.clear();
  s.feed(std::string(200000, 'y') + "\n", sink);  // ends with a newline: the last piece is short
  CHECK(got.size() == 4);
  CHECK(got[3].size() == 200000 - 3 * LineSplitter::kMaxLine);
  got.clear();
  s.feed(std::string(LineSplitter::kMaxLine, 'z') + "\n", sink);  // exactly the limit: one line
  CHECK(got.size() == 1);
}

TEST_CASE("PyTorch's error file JSON is read - anything else is not", "[units]") {
  std::string m, t;
  CHECK(parse_error_file(R"({"message": {"message": "RuntimeError: x", "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}})", m, t));
  CHECK(m == "RuntimeError: x");
  CHECK(t == "tb");
  m.clear();
  CHECK(parse_error_file(R"({"message": "plain"})", m, t));
  CHECK(m == "plain");
  CHECK_FALSE(parse_error_file("not json", m, t));
  CHECK_FALSE(parse_error_file("[1,2]", m, t));
}

TEST_CASE("stacks: Python's faulthandler, eu-stack and gdb are read into frames - identical stacks grouped", "[units]") {
  const std::string python =
      "Fatal Python error: Aborted\n\n"
      "Thread 0x00007f96551d66c0 (most recent call first):\n"
      "  File \"/tmp/stuck.py\", line 10 in <lambda>\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 982 in run\n\n"
      "Current thread 0x00007f965601eb80 (most recent call first):\n"
      "  File \"/tmp/stuck.py\", line 5 in stuck_in_all_reduce\n"
      "  File \"/tmp/stuck.py\", line 8 in train_step\n"
      "  File \"/tmp/stuck.py\", line 11 in <module>\n";
  auto py = parse_python_stack(python);
  REQUIRE(py.size() == 3);
  CHECK(describe_frames(py) == "stuck_in_all_reduce (stuck.py:5) <- train_step (stuck.py:8) <- <module> (stuck.py:11)");
  const std::string eu =
      "PID 10089 - process\nTID 10089:\n"
      "#0  0x00007fceb62f1dd0 pause - /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "    ../sysdeps/unix/sysv/linux/pause.c:29:10\n"
      "#1  0x000056260b1039f5 ddprun_test_stuck_in_all_reduce - /work/build/tests/test_worker\n"
      "    /work/tests/e2e/test_worker.cpp:79:19\n"
      "#2  0x000056260b103a09 ddprun_test_train_step() - /work/build/tests/test_worker\n"
      "    /work/tests/e2e/test_worker.cpp:83:34\n"
      "#3  0x000056260b103340 main - /work/build/tests/test_worker\n"
      "#4  0x00005563ca2ce3b3 - /usr/bin/sleep\n"
      "TID 10090:\n#0  0x00007fceb62f1dd0 other_thread - /work/build/tests/test_worker\n";
  auto native = parse_native_stack(eu);
  REQUIRE(native.size() == 4);
  CHECK(native[3].function == "??");  // no symbol: the module instead
  CHECK(native[3].file == "sleep");
  CHECK(describe_frames(native, 2) ==
        "ddprun_test_stuck_in_all_reduce (test_worker.cpp:79) <- ddprun_test_train_step() (test_worker.cpp:83) <- ...");
  const std::string gdb =
      "#0  0x00007fceb62f1dd0 in __libc_pause () at ../sysdeps/unix/sysv/linux/pause.c:29\n"
      "#1  0x000056260b1039f5 in ddprun_test_stuck_in_all_reduce () at /work/tests/e2e/test_worker.cpp:79\n"
      "#2  0x000056260b103340 in main (argc=2, argv=0x7ffebe520f58) at /work/tests/e2e/test_worker.cpp:121\n";
  auto g = parse_native_stack(gdb);
  REQUIRE(g.size() == 2);
  CHECK(g[0].function == "ddprun_test_stuck_in_all_reduce");
  CHECK(g[0].line == 79);
  CHECK(parse_python_stack("garbage\n").empty());
  auto gc = parse_python_stack("Current thread 0x00007f71 (most recent call first):\n  Garbage-collecting\n"
                               "  <no Python frame>\n");
  CHECK(describe_frames(gc) == "(garbage collection)");
  CHECK(describe_frames({}) == "(no stack)");
  std::map<int, std::vector<StackFrame>> by_rank = {{0, py}, {1, py}, {3, py}, {2, native}};
  CHECK(summarize_stacks(by_rank) ==
        "  ranks 0,1,3: stuck_in_all_reduce (stuck.py:5) <- train_step (stuck.py:8) <- <module> (stuck.py:11)\n"
        "  rank 2: ddprun_test_stuck_in_all_reduce (test_worker.cpp:79) <- ddprun_test_train_step() (test_worker.cpp:83) <- main <- ...\n");
}
