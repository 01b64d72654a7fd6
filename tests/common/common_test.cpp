// ddprun::common: strict parsing, the text of durations and addresses, the error codes.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <set>

#include <algorithm>

#include "ddprun/common/error.hpp"
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"

#include <cerrno>

using namespace ddprun;
using namespace std::chrono_literals;

TEST_CASE("parse_int takes the whole text as a base-10 integer, nothing else", "[common]") {
  CHECK(parse_int("42") == 42);
  CHECK(parse_int("-7") == -7);
  CHECK(parse_int("9223372036854775807") == 9223372036854775807LL);
  for (const char* bad : {"", " 1", "1 ", "+1", "1x", "0x10", "9223372036854775808", "1.0", "--1"}) {
    CHECK_FALSE(parse_int(bad));
  }
  CHECK(parse_int("5", 0, 5) == 5);
  CHECK_FALSE(parse_int("6", 0, 5));
  CHECK_FALSE(parse_int("-1", 0, 5));
}

TEST_CASE("parse_double takes finite numbers only", "[common]") {
  CHECK(parse_double("1.5") == 1.5);
  CHECK(parse_double("2") == 2.0);
  CHECK(parse_double("1e3") == 1000.0);
  for (const char* bad : {"", " 1", "1s", "nan", "inf", "1e999", ".", "0x10", "0x1p3", "1 "}) CHECK_FALSE(parse_double(bad));
}

TEST_CASE("durations and addresses read well in messages", "[common]") {
  CHECK(duration_text(5s) == "5 s");
  CHECK(duration_text(250ms) == "250 ms");
  CHECK(duration_text(1500ms) == "1.5 s");
  CHECK(format_address("node0", 29500) == "node0:29500");
  CHECK(format_address("::1", 1) == "[::1]:1");
}

TEST_CASE("split keeps empty fields, trim removes white space at both ends", "[common]") {
  CHECK(split("a,,b", ',') == std::vector<std::string>{"a", "", "b"});
  CHECK(split("", ',').empty());
  CHECK(split("a,", ',') == std::vector<std::string>{"a", ""});
  CHECK(trim("  x y \t\n") == "x y");
  CHECK(trim("   ").empty());
  CHECK(lower("PET_True-MIG-9") == "pet_true-mig-9");
  CHECK(lower("").empty());
}

TEST_CASE("escape_for_log: control bytes, bytes from 0x7f and the backslash escaped - bounded", "[common]") {
  using ddprun::escape_for_log;
  CHECK(escape_for_log("nccl/uid") == "nccl/uid");
  CHECK(escape_for_log("a\nb\r\tc") == "a\\nb\\r\\tc");
  CHECK(escape_for_log("\x1b[31m\x07\x7f\xff\\") == "\\x1b[31m\\x07\\x7f\\xff\\\\");
  CHECK(escape_for_log(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(escape_for_log(std::string(100, 'x'), 8) == "xxxxxxxx... (100 bytes)");
  CHECK(escape_for_log(std::string(8192, '\n')).size() == 64 * 2 + std::string("... (8192 bytes)").size());
}

TEST_CASE("exit_code_for: usage errors 2, every other error 1", "[common]") {
  CHECK(exit_code_for(UsageError("bad flag")) == 2);
  CHECK(exit_code_for(TimeoutError("late")) == 1);
  CHECK(exit_code_for(AddressInUseError("taken")) == 1);
  CHECK(exit_code_for(std::runtime_error("other")) == 1);
}

TEST_CASE("the environment map and the host name come from this process", "[common]") {
  ::setenv("DDPRUN_COMMON_TEST", "a=b", 1);
  CHECK(environment_map().at("DDPRUN_COMMON_TEST") == "a=b");
  CHECK_FALSE(host_name().empty());
}

TEST_CASE("random_hex: as many lower-case hex digits as asked, different at each draw", "[common]") {
  for (std::size_t n : {0u, 1u, 12u, 16u, 33u}) {
    auto h = ddprun::random_hex(n);
    CAPTURE(n, h);
    CHECK(h.size() == n);
    CHECK(h.find_first_not_of("0123456789abcdef") == std::string::npos);
  }
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(ddprun::random_hex(16));
  CHECK(seen.size() == 100);  // 64 bits each: a repeat is a broken generator
  // Every digit turns up (a generator stuck on some bits would miss some).
  std::string all;
  for (int i = 0; i < 50; ++i) all += ddprun::random_hex(32);
  for (char c : std::string("0123456789abcdef")) CHECK(all.find(c) != std::string::npos);
}

TEST_CASE("signals: names both ways, as kill -l spells them, and the stop set", "[common]") {
  for (int s : ddprun::stop_signals()) {
    CAPTURE(s);
    CHECK(ddprun::parse_signal(ddprun::signal_name(s)) == s);
  }
  CHECK(ddprun::signal_name(SIGRTMIN) == "SIGRTMIN");
  CHECK(ddprun::signal_name(SIGRTMIN + 1) == "SIGRTMIN+1");
  CHECK(ddprun::signal_name(SIGRTMAX) == "SIGRTMAX");
  CHECK(ddprun::signal_name(SIGRTMAX - 1) == "SIGRTMAX-1");
  CHECK(ddprun::parse_signal("RTMAX-2") == SIGRTMAX - 2);
  CHECK(ddprun::parse_signal("SIGRTMIN+99") == 0);
  CHECK(ddprun::parse_signal("SIGRTMAX-") == 0);
  CHECK(ddprun::parse_signal("USR1") == SIGUSR1);
  // Faults a process raises on itself, and what cannot be caught, are not in the stop set.
  auto set = ddprun::stop_signals();
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGKILL, SIGSTOP, SIGPIPE, SIGXFSZ, SIGCHLD}) {
    CHECK(std::find(set.begin(), set.end(), s) == set.end());
  }
  for (int s : {SIGTERM, SIGUSR1, SIGALRM, SIGXCPU, SIGPWR, SIGRTMIN, SIGRTMAX}) {
    CHECK(std::find(set.begin(), set.end(), s) != set.end());
  }
}

// Issue 33: "Resource temporarily unavailable" alone named neither what failed nor the limit.
TEST_CASE("a thread the kernel refuses is named, with the limit to raise", "[common]") {
  auto m = ddprun::task_refused("the metrics server's thread", EAGAIN);
  CHECK_THAT(m, Catch::Contains("cannot start the metrics server's thread: Resource temporarily unavailable"));
  CHECK_THAT(m, Catch::Contains("RLIMIT_NPROC") && Catch::Contains("ulimit -u") && Catch::Contains("every thread"));
  CHECK_THAT(ddprun::task_refused("x", ENOMEM), !Catch::Contains("RLIMIT_NPROC"));
}

TEST_CASE("read_worker_file: a regular file from an offset, at most as many bytes as asked - a FIFO or a directory gives nothing, at once", "[common]") {
  char tmpl[] = "/tmp/ddprun-common-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl, file = dir + "/f", fifo = dir + "/p";
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("0123456789", f);
    std::fclose(f);
  }
  CHECK(ddprun::read_worker_file(file, 100) == "0123456789");
  CHECK(ddprun::read_worker_file(file, 4) == "0123");
  CHECK(ddprun::read_worker_file(file, 100, 7) == "789");
  CHECK(ddprun::read_worker_file(file, 100, 10).empty());
  CHECK(ddprun::read_worker_file(dir + "/none", 100).empty());
  CHECK(ddprun::read_worker_file(dir, 100).empty());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(ddprun::read_worker_file(fifo, 100).empty());  // (a blocking open would wait for a writer)
  std::remove(fifo.c_str());
  std::remove(file.c_str());
  ::rmdir(dir.c_str());
}
