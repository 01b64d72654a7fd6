// Unit tests of the agent's small pieces: exit statuses, line splitting, error files, the
// round protocol's records.

#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "ddprun/agent/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "failure_report.hpp"
#include "output.hpp"
#include "round_protocol.hpp"

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

TEST_CASE("round records: each kind round-trips, anything malformed names the key", "[units]") {
  FailureRecord f;
  f.rank = 5;
  f.host = "n1";
  f.exit_code = 3;
  f.reason = "exit code 3";
  f.stderr_tail = {"a", "b"};
  for (const auto& e : {RoundEnd::of_failure(f), RoundEnd::of_stop(2, "n2", "id"), RoundEnd::of_node_lost(1, "n3", 2.5),
                        RoundEnd::of_membership("n4"), RoundEnd::of_success()}) {
    auto back = parse_round_end("k", round_end_json(e));
    CHECK(back.kind == e.kind);
    CHECK(back.host == e.host);
    CHECK(back.signal == e.signal);
    CHECK(back.group_rank == e.group_rank);
  }
  auto back = parse_round_end("k", round_end_json(RoundEnd::of_failure(f)));
  CHECK(back.failure->stderr_tail == std::deque<std::string>{"a", "b"});
  for (const char* bad : {"", "nul", "[1]", "{\"kind\":\"nope\"}", "{\"kind\":\"stopped\",\"signal\":\"9\"}",
                          "{\"kind\":\"failure\",\"exit_code\":999}", "{\"kind\":\"failure\",\"stderr_tail\":[1]}"}) {
    CHECK_THROWS_WITH(parse_round_end("ddprun/rdzv/x/r0/end", bad), Catch::Contains("malformed value at key 'ddprun/rdzv/x/r0/end'"));
  }
  NodeInfo n;
  n.host = "h";
  n.nproc = 4;
  n.addrs = {"10.0.0.1"};
  auto nb = parse_node("k", node_json(n));
  CHECK(nb.nproc == 4);
  CHECK(nb.addrs == n.addrs);
  CHECK_THROWS_AS(parse_node("k", "{\"nproc\": 0}"), ddprun::ProtocolError);
  CHECK(round_key(3, "end") == "r3/end");
}
