// End-to-end tests of the built ddprun binary with tiny workers (test_worker, sh).

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "ddprun/rendezvous/tcp_store.hpp"
#include "e2e/agents.hpp"
#include "e2e/launch.hpp"

using namespace ddprun::test;
namespace fs = std::filesystem;

namespace {

const std::string kStore = DDPRUN_STORE_BIN;

std::vector<std::string> with_ddprun(std::initializer_list<std::string> args) {
  std::vector<std::string> v = {kDdprun};
  v.insert(v.end(), args);
  return v;
}

std::map<std::string, std::string> parse_env(const std::string& out, int rank) {
  std::map<std::string, std::string> env;
  std::string prefix = "[default" + std::to_string(rank) + "]:";
  for (const auto& l : lines(out)) {
    if (l.rfind(prefix, 0) != 0) continue;
    auto kv = l.substr(prefix.size());
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace

TEST_CASE("every rank gets torchrun's environment", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=3", "--max_restarts=2", kWorker, "env"}),
           {{"DDPRUN_TEST_INHERITED", "yes"}});
  auto r = l.finish();
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::set<std::string> ports, run_ids, error_files;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = parse_env(r.out, rank);
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["LOCAL_RANK"] == std::to_string(rank));
    CHECK(env["WORLD_SIZE"] == "3");
    CHECK(env["LOCAL_WORLD_SIZE"] == "3");
    CHECK(env["GROUP_RANK"] == "0");
    CHECK(env["GROUP_WORLD_SIZE"] == "1");
    CHECK(env["ROLE_NAME"] == "default");
    CHECK(env["ROLE_RANK"] == std::to_string(rank));
    CHECK(env["ROLE_WORLD_SIZE"] == "3");
    CHECK(env["MASTER_ADDR"] == "127.0.0.1");
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "2");
    CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    CHECK(fs::exists(env["PYTHONPATH"].substr(0, env["PYTHONPATH"].find(':')) + "/sitecustomize.py"));  // progress hook
    CHECK(env["OMP_NUM_THREADS"] == "1");
    CHECK(env["DDPRUN_TEST_INHERITED"] == "yes");
    CHECK_THAT(env["TORCHELASTIC_ERROR_FILE"], Catch::EndsWith("/attempt_0/" + std::to_string(rank) + "/error.json"));
    CHECK_THAT(env["DDPRUN_HEARTBEAT_FILE"], Catch::EndsWith("/attempt_0/" + std::to_string(rank) + "/heartbeat"));
    ports.insert(env["MASTER_PORT"]);
    run_ids.insert(env["TORCHELASTIC_RUN_ID"]);
    error_files.insert(env["TORCHELASTIC_ERROR_FILE"]);
  }
  CHECK(ports.size() == 1);
  CHECK(*ports.begin() != "29500");  // --standalone binds a free port
  CHECK(run_ids.size() == 1);
  CHECK(run_ids.begin()->size() == 12);  // a random run id
  CHECK(error_files.size() == 3);
}

TEST_CASE("one node with --master_addr a name: the workers get the numeric address the store listens on", "[e2e]") {
  // (torchrun passes the name on; a worker's resolver may then answer ::1 first for localhost)
  auto r = Launch(with_ddprun({"--master_addr=localhost", "--master_port=0", kWorker, "env"})).finish();
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const auto env = parse_env(r.out, 0);
  const auto addr = env.at("MASTER_ADDR");
  CHECK((addr == "127.0.0.1" || addr == "::1"));
  CHECK_THAT(r.err, Catch::Contains("store " + addr + ":" + env.at("MASTER_PORT") + ")") ||
                        Catch::Contains("store [" + addr + "]:" + env.at("MASTER_PORT") + ")"));
}

TEST_CASE("a binary runs directly, with ${local_rank} substituted in its arguments", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc-per-node", "2", kWorker, "arg", "--shard=${local_rank}", "x"}));
  auto r = l.finish();
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[default0]:arg --shard=0"));
  CHECK_THAT(r.out, Catch::Contains("[default1]:arg --shard=1"));
  CHECK_THAT(r.out, Catch::Contains("[default1]:arg x"));
}

TEST_CASE("a failed group restarts with the restart count raised, until it succeeds", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--max_restarts=3", kWorker, "fail_before_attempt:2:5", "env"}));
  auto r = l.finish();
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[default1]:TORCHELASTIC_RESTART_COUNT=2"));
  CHECK_THAT(r.out, Catch::Contains("[default0]:TORCHELASTIC_RESTART_COUNT=2"));
  CHECK(Launch::occurrences(r.err, "restarting the worker group") == 2);
}

TEST_CASE("exhausted restarts end with the worker's exit code and a summary", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--max_restarts=1", kWorker, "stderr:about to fail",
                   "exit_if_rank:1:7", "block"}));
  auto r = l.finish();
  INFO(r.out << r.err);
  CHECK(r.code == 7);
  CHECK_THAT(r.err, Catch::Contains("Root cause (first observed failure)"));
  CHECK_THAT(r.err, Catch::Contains("rank       : 1 (local_rank 1"));
  CHECK_THAT(r.err, Catch::Contains("failure    : exit code 7"));
  CHECK_THAT(r.err, Catch::Contains("about to fail"));  // its last stderr lines
  CHECK_THAT(r.err, Catch::Contains("rank 0 (local_rank 0"));  // the other failure: stopped by ddprun
  CHECK_THAT(r.err, Catch::Contains("stopped by ddprun"));
  CHECK_THAT(r.err, Catch::Contains("ddprun exits with 7"));
}

TEST_CASE("a worker killed by a signal gives 128 + the signal", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", kWorker, "exit_if_rank:0:0", "signal:SEGV"}));
  auto r = l.finish();
  INFO(r.out << r.err);
  CHECK(r.code == 128 + SIGSEGV);
  CHECK_THAT(r.err, Catch::Contains("signal SIGSEGV (11)"));
}

TEST_CASE("the error file a worker writes appears in the summary (its path where it is kept)", "[e2e]") {
  auto dir = temp_dir();
  for (const bool logs : {false, true}) {
    auto r = Launch(with_ddprun({"--standalone", "--nproc_per_node=1", "--log_dir=" + (logs ? dir : std::string()),
                                 kWorker, "errorfile", "exit:1"}))
                 .finish();
    INFO(r.out << r.err);
    CHECK(r.code == 1);
    CHECK_THAT(r.err, Catch::Contains("ValueError: loss is NaN at step 7"));
    CHECK_THAT(r.err, Catch::Contains("File \"train.py\", line 12, in step"));
    // (without --log_dir the file is in ddprun's temporary directory, gone at the end)
    CHECK(Launch::occurrences(r.err, "error file : " + dir + "/") == (logs ? 1 : 0));
    CHECK(Launch::occurrences(r.err, "error file :") == (logs ? 1 : 0));
  }
  fs::remove_all(dir);
}

// The agent reads what a worker left as its error file: a FIFO there (no writer) blocked it for
// good, with the job's end unreported and the other workers unwatched.
TEST_CASE("a FIFO left as a worker's error file does not stop ddprun reporting its failure", "[e2e]") {
  auto r = Launch(with_ddprun({"--standalone", "--nproc_per_node=1", "--no_python", "/bin/sh", "-c",
                               "rm -f \"$TORCHELASTIC_ERROR_FILE\" && mkfifo \"$TORCHELASTIC_ERROR_FILE\" && exit 3"}))
               .finish(30s);
  INFO(r.out << r.err);
  CHECK(r.code == 3);
  CHECK_THAT(r.err, Catch::Contains("failure    : exit code 3"));
}

TEST_CASE("one worker dying while another blocks tears the group down at once", "[e2e]") {
  // rank 0 blocks forever (as in a collective whose peer died); rank 1 fails.
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--stop_timeout=30", kWorker, "exit_if_rank:1:3", "block"}));
  auto r = l.finish(20s);
  INFO(r.out << r.err);
  CHECK(r.code == 3);
  CHECK(r.seconds < 5);  // SIGTERM ended rank 0: no need for the 30 s grace period
}

TEST_CASE("a worker that ignores SIGTERM is killed after the grace period", "[e2e]") {
  // Rank 1 fails only once rank 0 ignores SIGTERM (it creates a file then), so the SIGTERM
  // cannot arrive before the trap is set.
  auto dir = temp_dir();
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--stop_timeout=0.3", "--no_python", "sh", "-c",
                        "if [ $RANK = 1 ]; then while [ ! -e " + dir + "/trapped ]; do sleep 0.01; done; exit 4; fi; "
                        "trap '' TERM; touch " + dir + "/trapped; while :; do sleep 0.05; done"}));
  auto r = l.finish(20s);
  fs::remove_all(dir);
  INFO(r.out << r.err);
  CHECK(r.code == 4);
  CHECK_THAT(r.err, Catch::Contains("sending SIGKILL"));
}

TEST_CASE("nothing survives kill -9 of ddprun, grandchildren included", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", kWorker, "pid", "grandchild", "ready", "block"}));
  REQUIRE(l.wait_for("ready", 2));
  std::vector<pid_t> pids;
  std::regex re(R"(\]:(pid|grandchild) (\d+))");
  for (std::sregex_iterator it(l.out().begin(), l.out().end(), re), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[2]));
  }
  REQUIRE(pids.size() == 4);
  for (pid_t p : pids) REQUIRE(::kill(p, 0) == 0);
  l.signal(SIGKILL);
  l.finish();
  for (pid_t p : pids) {
    INFO("pid " << p);
    CHECK(process_gone(p, 5s));
  }
}

TEST_CASE("SIGINT is forwarded to the workers and ddprun exits 130", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", kWorker, "trap:INT", "ready", "block"}));
  REQUIRE(l.wait_for("ready", 2));
  l.signal(SIGINT);
  auto r = l.finish(20s);
  INFO(r.out << r.err);
  CHECK(r.code == 130);
  CHECK(Launch::occurrences(r.out, "got INT") == 2);
}

TEST_CASE("SIGUSR1 is forwarded when listed in --signals_to_handle", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--signals_to_handle=SIGUSR1", kWorker, "trap:USR1", "ready",
                   "block"}));
  REQUIRE(l.wait_for("ready", 2));
  l.signal(SIGUSR1);
  auto r = l.finish(20s);
  INFO(r.out << r.err);
  CHECK(r.code == 128 + SIGUSR1);
  CHECK(Launch::occurrences(r.out, "got USR1") == 2);
}

TEST_CASE("a worker without heartbeats for --worker_timeout is failed as hung", "[e2e]") {
  SECTION("hung worker") {
    Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--worker_timeout=0.5", kWorker, "heartbeat:3:50",
                     "exit_if_rank:0:0", "block"}));
    auto r = l.finish(20s);
    INFO(r.out << r.err);
    CHECK(r.code == 124);
    CHECK_THAT(r.err, Catch::Contains("no heartbeat for"));
    CHECK_THAT(r.err, Catch::Contains("rank       : 1"));
  }
  SECTION("a worker that beats regularly runs to completion") {
    Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--worker_timeout=0.5", kWorker, "heartbeat:15:100"}));
    auto r = l.finish(20s);
    INFO(r.out << r.err);
    CHECK(r.code == 0);
  }
}

TEST_CASE("console lines are whole and prefixed under load", "[e2e]") {
  constexpr int kLines = 3000;
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=4", kWorker, "flood:3000:500", "longline:200000"}));
  auto r = l.finish(60s);
  REQUIRE(r.code == 0);
  std::regex line_re(R"(\[default(\d)\]:r(\d) l(\d+) ([a-z]+) end)");
  std::map<int, int> counts;
  int long_pieces = 0;
  for (const auto& line : lines(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, line_re)) {
      CHECK(m[1] == m[2]);  // the prefix names the rank that wrote the line
      CHECK(m[4].length() == 500);
      CHECK(m[4].str() == std::string(500, static_cast<char>('a' + std::stoi(m[2]))));
      counts[std::stoi(m[1])]++;
    } else if (line.size() > 11 && line.compare(0, 8, "[default") == 0 && line.compare(9, 2, "]:") == 0 &&
               line.find_first_not_of('x', 11) == std::string::npos) {
      ++long_pieces;  // (std::regex would overflow the stack on a 64 KiB line)
    } else {
      FAIL_CHECK("mangled line: " << line.substr(0, 200));
    }
  }
  for (int rank = 0; rank < 4; ++rank) CHECK(counts[rank] == kLines);
  CHECK(long_pieces == 4 * 4);  // 200,000 characters = 4 pieces of at most 64 KiB each
}

TEST_CASE("log files: --log_dir, --redirects and --tee write per-rank files", "[e2e]") {
  auto dir = temp_dir();
  SECTION("redirects: files only") {
    Launch l(with_ddprun({"--nproc_per_node=2", "--master_port=0", "--rdzv_id=job1", "--log_dir=" + dir, "--redirects=3",
                     kWorker, "stderr:oops", "arg", "hello"}));
    auto r = l.finish();
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("hello") == std::string::npos);
    for (int rank = 0; rank < 2; ++rank) {
      std::string base = dir + "/job1/attempt_0/" + std::to_string(rank);
      std::ifstream out(base + "/stdout.log"), err(base + "/stderr.log");
      std::stringstream so, se;
      so << out.rdbuf();
      se << err.rdbuf();
      CHECK(so.str() == "arg hello\n");
      CHECK(se.str() == "oops\n");
    }
  }
  SECTION("tee: files and console, per-rank selection") {
    Launch l(with_ddprun({"--nproc_per_node=2", "--master_port=0", "--rdzv_id=job2", "--log_dir=" + dir, "--tee=0:1",
                     kWorker, "arg", "hello"}));
    auto r = l.finish();
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("[default0]:arg hello"));
    CHECK_THAT(r.out, Catch::Contains("[default1]:arg hello"));
    CHECK(fs::exists(dir + "/job2/attempt_0/0/stdout.log"));
    CHECK_FALSE(fs::exists(dir + "/job2/attempt_0/1/stdout.log"));
  }
  fs::remove_all(dir);
}

TEST_CASE("console filter and prefix template: --local_ranks_filter, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=3", "--local_ranks_filter=0,2", kWorker, "arg", "hi"}),
           {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${role_name}|${rank}|${local_rank}> "}});
  auto r = l.finish();
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("<default|0|0> arg hi"));
  CHECK_THAT(r.out, Catch::Contains("<default|2|2> arg hi"));
  CHECK(r.out.find("<default|1|1>") == std::string::npos);
}

TEST_CASE("a restarted attempt does not see the previous attempt's store keys", "[e2e]") {
  Launch l(with_ddprun({"--standalone", "--nproc_per_node=2", "--max_restarts=1", kWorker, "store_absent:key${local_rank}",
                   "store_set:key${local_rank}", "fail_before_attempt:1:3"}));
  auto r = l.finish();
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(Launch::occurrences(r.err, "restarting the worker group") == 1);
}

TEST_CASE("PET_ environment variables stand in for flags - flags win", "[e2e]") {
  Launch l(with_ddprun({"--standalone", kWorker, "env"}), {{"PET_NPROC_PER_NODE", "2"}});
  auto r = l.finish();
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[default1]:WORLD_SIZE=2"));
  Launch l2(with_ddprun({"--standalone", "--nproc_per_node=1", kWorker, "env"}), {{"PET_NPROC_PER_NODE", "2"}});
  auto r2 = l2.finish();
  CHECK_THAT(r2.out, Catch::Contains("[default0]:WORLD_SIZE=1"));
}

TEST_CASE("help and version flags", "[e2e]") {
  auto r = Launch(with_ddprun({"--help"})).finish();
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("Worker group"));
  CHECK_THAT(r.out, Catch::Contains("--nproc_per_node"));
  CHECK_THAT(r.out, Catch::Contains("Failures and hangs"));
  auto v = Launch(with_ddprun({"--version"})).finish();
  CHECK(v.code == 0);
  CHECK_THAT(v.out, Catch::StartsWith("ddprun "));
}

TEST_CASE("bad input gets one clear message and exit 2", "[e2e]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  auto dir = temp_dir();
  std::string not_exec = dir + "/train";
  std::ofstream(not_exec) << "#!/bin/sh\necho hi\n";
  std::vector<Case> cases = {
      {{"--nproc_per_node=0", kWorker}, "--nproc_per_node must be a positive integer, 'cpu', 'gpu' or 'auto' (got '0')"},
      {{"--nproc_per_node=-1", kWorker}, "(got '-1')"},
      {{"--nproc_per_node=many", kWorker}, "(got 'many')"},
      {{"--nnodes=3:2", kWorker}, "--nnodes=3:2: MIN is larger than MAX"},
      {{"--standalone"}, "no training program given"},
      {{"--standalone", "/nonexistent/train"}, "training program '/nonexistent/train' not found"},
      {{"--standalone", "missing.py"}, "training script 'missing.py' not found"},
      {{"--standalone", not_exec}, "is not executable: chmod +x it"},
      {{"--frobnicate", kWorker}, "unknown option '--frobnicate'"},
      {{"--master_port=70000", kWorker}, "--master_port must be a port number 0-65535 (got '70000')"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=host:port:x", kWorker}, "--rdzv_endpoint='host:port:x' is malformed"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=[::1", kWorker}, "missing ']'"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=node:99999", kWorker}, "port must be 0-65535"},
      {{"--signals_to_handle=SIGKILL", kWorker}, "'SIGKILL' is not a signal that ends a process from outside"},
      {{"--redirects=5", kWorker}, "--redirects values are 0 (none)"},
      {{"-m", "--no_python", "x"}, "-m and --no_python cannot be used together"},
      {{"--worker_timeout=-1", kWorker}, "--worker_timeout must be a non-negative number of seconds"},
      {{"--worker_timeout=10000001", kWorker}, "--worker_timeout must be at most 10000000 seconds, about 115 days"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=256.1.1.1:0", kWorker}, "not an IPv4 address"},
      {{"--max_restarts"}, "needs a value"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {kDdprun};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = Launch(argv).finish();
    INFO("ddprun " << c.args[0] << " ...: " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("ddprun: error: "));
    CHECK_THAT(r.err, Catch::Contains(c.message));
    CHECK(Launch::occurrences(r.err, "\n") == 1);  // one line
    CHECK(r.err.find("terminate called") == std::string::npos);
  }
  // A value of 100 KB is not echoed whole, whichever check refuses it.
  const std::string huge(100000, 'x');
  for (const auto& arg : {"--hang_floor=" + huge, "--max_restarts=x" + huge, "--log_level=" + huge, "--" + huge,
                          "--rdzv_conf=" + huge + "=1"}) {
    auto r = Launch({kDdprun, "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", arg, kWorker}).finish();
    INFO(arg.substr(0, 20) << "...: " << r.err.substr(0, 300));
    CHECK(r.code == 2);
    CHECK(r.err.size() < 1000);
    CHECK_THAT(r.err, Catch::Contains("xxxxxxxx"));  // the value's start is shown
  }
  // A FIFO where a file is read or written is refused at once: opened as a file, it would block
  // until someone opened its other end (ddprun hung, silent).
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> fifos = {
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_conf=secret_file=" + fifo}, "the secret file '" + fifo + "' is not a regular file"},
      {{"--standalone", "--events_file=" + fifo}, "'" + fifo + "' is not a file (a FIFO or socket with no reader"},
      {{"--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:2379", "--rdzv_conf=cacert=" + fifo}, "cacert=" + fifo + ": is not a regular file"},
  };
  for (const auto& [args, message] : fifos) {
    std::vector<std::string> argv = {kDdprun};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(kWorker);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = Launch(argv).finish();
    INFO(args.back() << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(message));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
  // A training script or program that is there but no file is named as what it is, not as missing.
  const std::string fifo_py = dir + "/train.py";
  REQUIRE(::mkfifo(fifo_py.c_str(), 0700) == 0);
  const std::vector<std::pair<std::string, std::string>> scripts = {
      {fifo_py, "training script '" + fifo_py + "' is not a regular file (a FIFO"},
      {fifo, "training program '" + fifo + "' is not a regular file (a FIFO"},
      {dir, "training program '" + dir + "' is a directory"},
  };
  for (const auto& [script, message] : scripts) {
    auto r = Launch({kDdprun, "--standalone", script}).finish();
    INFO(script << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(message));
  }
  // An executable file in the working directory named without './': PATH is searched, not it.
  fs::permissions(not_exec, fs::perms::owner_all);
  auto r = Launch({"/bin/sh", "-c", "cd " + dir + " && exec " + kDdprun + " --standalone train"}).finish();
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("'train' is not in PATH") && Catch::Contains("give ./train"));
  fs::remove_all(dir);
}

TEST_CASE("ddprun-store: bad input gets one clear message and exit 2 - a stray word, an empty secret file, counts out of range", "[e2e]") {
  const std::string huge(100000, '1');
  std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"29500"}, "'29500' is not an option: ddprun-store takes options only (a port: --port 29500"},
      {{"--allow", "10.0.0.0/8", "192.168.0.0/16"}, "'192.168.0.0/16' is not an option"},
      {{"--count_requests", "yes"}, "'yes' is not an option"},
      {{"--secret_file", ""}, "--secret_file needs a path (it was given empty)"},
      {{"--max_connections=-1"}, "--max_connections must be 1 to 1000000000 (got a negative number)"},
      {{"--max_keys_per_request", "0"}, "--max_keys_per_request must be 1 to 1000000000 (got 0)"},
      {{"--max_key_bytes", "0"}, "--max_key_bytes must be 1 to 1000000000 (got 0)"},
      {{"--reserved_fds", "100000000"}, "--reserved_fds must be 0 to 1000000"},
      {{"--tcp_keepalive_s", "40000"}, "--tcp_keepalive_s must be at most 32767"},
      {{"--port", huge}, "... (100000 bytes)"},
      {{"--log_level", "a\nb\x1b[31m"}, "unknown --log_level 'a\\nb\\x1b[31m'"},  // escaped: one line, no terminal codes
  };
  // (the open-file limit: its own, so that a machine's larger one does not let the store start)
  cases.push_back({{"--reserved_fds", "1010"}, "leaves no descriptor for a client under this process's open-file limit (1024"});
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {"prlimit", "--nofile=1024:1024", kStore};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = Launch(argv).finish(std::chrono::seconds(10));
    INFO(args[0] << " ...: " << r.err.substr(0, 400));
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("ddprun-store: ") && Catch::Contains(message));
    CHECK(r.err.size() < 1000);
    CHECK(r.out.find("listening on") == std::string::npos);
  }
}

TEST_CASE("ddprun-store --count_requests tells at most 4096 key patterns apart - the rest are <other>", "[e2e]") {
  Launch store({kStore, "--port", "0", "--count_requests"});
  REQUIRE(store.wait_for("listening on"));
  const auto line = store.out();
  const auto port = std::stoi(line.substr(line.rfind(':') + 1));
  ddprun::rendezvous::TcpStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  ddprun::rendezvous::TcpStore client(o);
  for (int i = 0; i < 5000; ++i) {  // 5000 patterns: letters, not digits (digits are one <n>)
    std::string key = "k";
    for (int n = i; n > 0 || key.size() == 1; n /= 26) key += static_cast<char>('a' + n % 26);
    client.add(key, 1);
  }
  store.signal(SIGTERM);
  auto r = store.finish();
  const auto rows = Launch::occurrences(r.out, "\nADD ");
  INFO(r.out.substr(r.out.size() > 600 ? r.out.size() - 600 : 0));
  CHECK(rows <= 4096);
  CHECK(rows >= 4000);
  CHECK_THAT(r.out, Catch::Contains("<other>") && Catch::Contains("total"));
}

TEST_CASE("a store address already in use is named, with a hint", "[e2e]") {
  Launch store({kStore, "--host", "127.0.0.1", "--port", "0"});
  REQUIRE(store.wait_for("listening on"));
  auto line = store.out();
  auto port = line.substr(line.rfind(':') + 1);
  port = port.substr(0, port.find('\n'));
  auto r = Launch(with_ddprun({"--nproc_per_node=1", "--master_port=" + port, kWorker})).finish();
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("127.0.0.1:" + port));
  CHECK_THAT(r.err, Catch::Contains("already in use"));
  CHECK_THAT(r.err, Catch::Contains("--standalone"));
  CHECK_THAT(r.err, Catch::Contains("or another port in --master_port."));
  // Read from PET_MASTER_PORT (Kubeflow): the variable is named, not a flag the user never gave.
  auto pet = Launch(with_ddprun({"--nproc_per_node=1", kWorker}), {{"PET_MASTER_PORT", port}}).finish();
  INFO(pet.err);
  CHECK(pet.code == 1);
  CHECK_THAT(pet.err, Catch::Contains("or another port in PET_MASTER_PORT (read as --master_port)."));
  // The store given as --rdzv_endpoint (static, one node): that is what the hint names.
  auto at = Launch(with_ddprun({"--nproc_per_node=1", "--rdzv_endpoint=127.0.0.1:" + port, kWorker})).finish();
  INFO(at.err);
  CHECK(at.code == 1);
  CHECK_THAT(at.err, Catch::Contains("already in use") && Catch::Contains("or another port in --rdzv_endpoint"));
  store.signal(SIGTERM);
  CHECK(store.finish().code == 0);
}

TEST_CASE("restarts of 8 workers are reliable, run after run", "[e2e]") {
  // Regression: a drain timer firing as the last pipe closed finished an attempt twice, which
  // used up the restart budget without a restart.
  for (int run = 0; run < 15; ++run) {
    // attempt 0: rank 1 fails, the others block until stopped; attempt 1: all exit 0.
    Launch l(with_ddprun({"--standalone", "--nproc_per_node=8", "--max_restarts=1", kWorker, "fail_before_attempt:1:3",
                          "block_if_attempt:0"}));
    auto r = l.finish(20s);
    INFO("run " << run << "\n" << r.err);
    REQUIRE(r.code == 0);
    REQUIRE(Launch::occurrences(r.err, "restarting the worker group") == 1);
  }
}
