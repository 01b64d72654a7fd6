// Unit tests of the agent's and launcher's pieces: exit statuses, line splitting, error files,
// command-line parsing.

#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "ddprun/agent/exit_status.hpp"
#include "ddprun/launcher/cli.hpp"
#include "ddprun/common/error.hpp"
#include "failure_report.hpp"
#include "output.hpp"

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

namespace {

launcher::CliResult parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}, int gpus = 0) {
  launcher::HostInfo host;
  host.cpus = 6;
  host.count_gpus = [gpus] { return gpus; };
  if (!env.count("PATH")) env["PATH"] = "/usr/bin:/bin";
  return launcher::parse_command_line(args, env, host);
}

}  // namespace

TEST_CASE("nproc_per_node accepts a number, cpu, gpu and auto", "[units]") {
  CHECK(parse({"--nproc_per_node=3", "/bin/true"}).agent.nproc_per_node == 3);
  CHECK(parse({"--nproc_per_node", "cpu", "/bin/true"}).agent.nproc_per_node == 6);
  CHECK(parse({"--nproc_per_node=gpu", "/bin/true"}, {}, 8).agent.nproc_per_node == 8);
  CHECK(parse({"--nproc_per_node=auto", "/bin/true"}, {}, 0).agent.nproc_per_node == 6);
  CHECK(parse({"--nproc_per_node=auto", "/bin/true"}, {}, 2).agent.nproc_per_node == 2);
  CHECK_THROWS_WITH(parse({"--nproc_per_node=gpu", "/bin/true"}), Catch::Contains("no GPU found"));
}

TEST_CASE("the program decides how workers are started", "[units]") {
  auto py = parse({"--standalone", "/bin/true", "a"}, {{"PYTHON_EXEC", "true"}});
  CHECK(py.agent.command == std::vector<std::string>{"/bin/true", "a"});
  auto mod = parse({"-m", "pkg.train", "--lr", "1"}, {{"PYTHON_EXEC", "sh"}});
  CHECK(mod.agent.command == std::vector<std::string>{"/usr/bin/sh", "-u", "-m", "pkg.train", "--lr", "1"});
  auto path = parse({"--no_python", "true"});
  CHECK(path.agent.command == std::vector<std::string>{"/usr/bin/true"});
  // options after the program belong to the program
  auto rest = parse({"--nproc_per_node=2", "/bin/true", "--nproc_per_node=5"});
  CHECK(rest.agent.nproc_per_node == 2);
  CHECK(rest.agent.command.back() == "--nproc_per_node=5");
}

TEST_CASE("store placement follows the rendezvous flags", "[units]") {
  auto st = parse({"--master_addr=127.0.0.2", "--master_port=1234", "/bin/true"});
  CHECK(st.agent.store_host == "127.0.0.2");
  CHECK(st.agent.store_port == 1234);
  auto sa = parse({"--standalone", "/bin/true"});
  CHECK(sa.agent.store_host == "127.0.0.1");
  CHECK(sa.agent.store_port == 0);
  auto c10d = parse({"--rdzv-backend=c10d", "--rdzv-endpoint=[::1]", "/bin/true"});
  CHECK(c10d.agent.store_host == "::1");
  CHECK(c10d.agent.store_port == 29400);
  auto multi = parse({"--nnodes=2", "--node_rank=1", "--master_port=1234", "/bin/true"});
  CHECK(multi.agent.rdzv.enabled);
  CHECK_FALSE(multi.agent.rdzv.dynamic);
  CHECK(multi.agent.rdzv.is_host == 0);
  CHECK(multi.agent.rdzv.endpoint_port == 1234);
  auto elastic = parse({"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=node0",
                        "--rdzv_conf=join_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2,is_host=false", "/bin/true"});
  CHECK(elastic.agent.rdzv.dynamic);
  CHECK(elastic.agent.rdzv.min_nodes == 2);
  CHECK(elastic.agent.rdzv.max_nodes == 4);
  CHECK(elastic.agent.rdzv.endpoint_port == 29400);
  CHECK(elastic.agent.rdzv.join_timeout == std::chrono::seconds(5));
  CHECK(elastic.agent.rdzv.keep_alive_max_attempt == 2);
  CHECK(elastic.agent.rdzv.is_host == 0);
  CHECK_THROWS_WITH(parse({"--nnodes=2:4", "/bin/true"}), Catch::Contains("a range needs --rdzv_backend=c10d"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--node_rank=2", "/bin/true"}), Catch::Contains("must be below --nnodes=2"));
  CHECK_THROWS_WITH(parse({"--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_conf=bogus=1", "/bin/true"}),
                    Catch::Contains("unknown key 'bogus'"));
}
