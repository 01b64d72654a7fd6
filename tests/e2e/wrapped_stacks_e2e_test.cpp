// Stacks wherever the worker is: behind `sh -c` and a wrapper script, Python found by the
// process tree (not argv[0]); native stacks read by ddprun-stack on a machine without eu-stack
// or gdb (hidden in a private mount namespace).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "e2e/agents.hpp"
#include "skip.hpp"

using namespace ddprun::test;
namespace fs = std::filesystem;

namespace {

const std::string kPython = "/usr/bin/python3";

struct Dir {
  std::string path;
  Dir() {
    path = temp_dir();
  }
  ~Dir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text, bool executable = false) {
    auto p = path + "/" + name;
    std::ofstream(p) << text;
    if (executable) ::chmod(p.c_str(), 0755);
    return p;
  }
  std::string slurp(const std::string& name) const {
    std::ifstream in(path + "/" + name);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

// Rank 1 beats once, then sticks in a named function; rank 0 keeps beating.
const char* kStuckScript =
    "import os, time\n"
    "def stuck_in_all_reduce():\n"
    "    while True:\n"
    "        time.sleep(0.05)\n"
    "def train_step():\n"
    "    stuck_in_all_reduce()\n"
    "os.utime(os.environ['DDPRUN_HEARTBEAT_FILE'])\n"
    "if os.environ['RANK'] == '1':\n"
    "    train_step()\n"
    "while True:\n"
    "    os.utime(os.environ['DDPRUN_HEARTBEAT_FILE'])\n"
    "    time.sleep(0.05)\n";

}  // namespace

TEST_CASE("stacks: a Python worker behind sh -c or a wrapper script gets its traceback", "[stacks]") {
  SKIP_UNLESS(fs::exists(kPython), kPython + " is missing");
  Dir dir;
  auto script = dir.write("train.py", kStuckScript);
  auto wrapper = dir.write("wrap.sh", "#!/bin/sh\nexport WRAPPED=1\n" + kPython + " -u \"$@\"\nexit $?\n", true);
  // Neither execs Python: the shell stays the worker, Python is its child.
  auto how = GENERATE(as<std::string>{}, "sh -c", "wrapper script");
  std::vector<std::string> program = how == "sh -c"
                                         ? std::vector<std::string>{"/bin/sh", "-c", kPython + " -u " + script + "; exit $?"}
                                         : std::vector<std::string>{wrapper, script};
  std::vector<std::string> args = {"--nproc_per_node=2", "--master_port=0", "--rdzv_id=wrapped", "--worker_timeout=1",
                                   "--stop_timeout=1", "--log_dir=" + dir.path, "--no_python"};
  args.insert(args.end(), program.begin(), program.end());
  auto r = Launch(cmd(args)).finish(60s);
  INFO(how << "\n" << r.err);
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("]: stuck_in_all_reduce (train.py:4) <- train_step (train.py:6) <- <module> (train.py:9)"));
  CHECK_THAT(r.err, Catch::Contains("]: <module> (train.py:1"));
  auto text = dir.slurp("wrapped/attempt_0/1/stack.txt");
  CHECK_THAT(text, !Catch::Contains("Fatal Python error"));  // read through the hook's signal: not ended
  CHECK_THAT(text, Catch::Contains("in stuck_in_all_reduce"));
}

TEST_CASE("stacks: a native worker behind sh -c, on a machine without eu-stack and gdb, gets its stack with names",
          "[stacks]") {
  SKIP_UNLESS(::geteuid() == 0, "hiding eu-stack and gdb needs a private mount namespace (root)");
  auto unshare = ddprun::agent::find_executable("unshare", "/usr/bin:/bin");
  SKIP_UNLESS(!unshare.empty(), "unshare (util-linux) is missing");
  REQUIRE(fs::exists(fs::path(kDdprun).parent_path() / "ddprun-stack"));  // built with libdw (scripts/setup.sh)
  Dir dir;
  // In the namespace eu-stack and gdb are /dev/null (not executable), whatever the PATH.
  std::string run = "for t in /usr/bin/eu-stack /usr/bin/gdb /bin/eu-stack /bin/gdb; do "
                    "  [ -e \"$t\" ] && mount --bind /dev/null \"$t\"; done; "
                    "if eu-stack --version >/dev/null 2>&1 || gdb --version >/dev/null 2>&1; then "
                    "  echo 'eu-stack or gdb still runs'; exit 99; fi; "
                    "exec \"$@\"";
  auto r = Launch({unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", run, "sh", kDdprun,
                   "--nproc_per_node=2", "--master_port=0", "--rdzv_id=native", "--worker_timeout=0.5",
                   "--stop_timeout=1", "--log_dir=" + dir.path, "--no_python", "/bin/sh", "-c",
                   kWorker + " heartbeat:2:50 stuck; exit $?"})
               .finish(60s);
  INFO(r.out << r.err);
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("ranks 0-1 [sleeping]: ddprun_test_stuck_in_all_reduce (test_worker.cpp:"));
  CHECK_THAT(r.err, Catch::Contains("<- ddprun_test_train_step"));
  auto text = dir.slurp("native/attempt_0/1/stack.txt");
  CHECK_THAT(text, Catch::Contains("started by worker pid"));
  CHECK_THAT(text, Catch::Contains("main"));
  CHECK_THAT(text, !Catch::Contains("neither eu-stack nor gdb"));
}
