// Where a hung worker's stack is read: the process tree below it (a fake /proc of stat files and
// exe links, then the real one), Python found by executable whatever started it.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "ddprun/agent/spawn.hpp"
#include "containment/process_tree.hpp"

using namespace ddprun::agent;
namespace fs = std::filesystem;

namespace {

// A /proc of its own: PID/stat ("PID (COMM) S PPID ...") and PID/exe (a link; its target need
// not exist, as readlink does not follow it).
struct FakeProc {
  std::string root;
  FakeProc() {
    std::string t = (fs::temp_directory_path() / "ddprun-proc-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    root = t;
  }
  ~FakeProc() { fs::remove_all(root); }
  void add(pid_t pid, pid_t parent, const std::string& exe, const std::string& comm = "x") {
    auto dir = root + "/" + std::to_string(pid);
    fs::create_directories(dir);
    std::ofstream(dir + "/stat") << pid << " (" << comm << ") S " << parent << " " << pid << " 0 0 -1\n";
    fs::create_symlink(exe, dir + "/exe");
  }
};

}  // namespace

TEST_CASE("process tree: Python interpreters and wrappers are told by their executable", "[units]") {
  for (const char* yes : {"python", "python3", "/usr/bin/python3.11", "/opt/conda/bin/python3.12d",
                          "/usr/bin/python3.11 (deleted)"}) {
    CHECK(is_python_executable(yes));
  }
  for (const char* no : {"/opt/train", "/usr/bin/python3-config", "pythonista", "/usr/bin/ipython3", "/bin/sh", ""}) {
    CHECK_FALSE(is_python_executable(no));
  }
  CHECK(is_wrapper_executable("/bin/sh"));
  CHECK(is_wrapper_executable("/usr/bin/env"));
  CHECK(is_wrapper_executable("/usr/bin/numactl"));
  CHECK_FALSE(is_wrapper_executable("/opt/train"));
  CHECK_FALSE(is_wrapper_executable("/usr/bin/python3"));
}

TEST_CASE("process tree: each worker's Python processes and the program behind its wrappers", "[units]") {
  FakeProc proc;
  proc.add(1, 0, "/sbin/init");
  proc.add(100, 1, "/bin/sh");               // sh -c 'python3 train.py; echo done'
  proc.add(101, 100, "/usr/bin/python3.11");  // the trainer ...
  proc.add(102, 101, "/usr/bin/python3.11");  // ... and its DataLoader workers
  proc.add(103, 101, "/usr/bin/python3.11");
  proc.add(200, 1, "/bin/bash");              // bash train.sh -> env X=1 /opt/train
  proc.add(201, 200, "/usr/bin/env");
  proc.add(202, 201, "/opt/train");
  proc.add(300, 1, "/usr/bin/python3");       // python3 -u train.py, as ddprun starts it
  proc.add(400, 1, "/bin/sh");                // two Python programs side by side
  proc.add(401, 400, "/usr/bin/python3");
  proc.add(402, 400, "/usr/bin/python3");
  proc.add(500, 1, "/opt/train");             // a native trainer with a child of its own
  proc.add(501, 500, "/opt/train");
  proc.add(600, 1, "/bin/sh");                // a wrapper running two programs: itself is read
  proc.add(601, 600, "/opt/a");
  proc.add(602, 600, "/opt/b");
  proc.add(700, 1, "/usr/bin/python3.11 (deleted)", "odd) (name");  // ") " inside the command name
  auto tree = ProcessTree::read(proc.root);

  CHECK(tree.subtree(100) == std::vector<pid_t>{100, 101, 102, 103});
  CHECK(tree.stack_targets(100).python == std::vector<pid_t>{101});
  auto t200 = tree.stack_targets(200);
  CHECK(t200.python.empty());
  CHECK(t200.native == 202);
  CHECK(tree.stack_targets(300).python == std::vector<pid_t>{300});
  CHECK(tree.stack_targets(400).python == std::vector<pid_t>{401, 402});
  CHECK(tree.stack_targets(500).native == 500);
  CHECK(tree.stack_targets(600).native == 600);
  CHECK(tree.stack_targets(700).python == std::vector<pid_t>{700});
  CHECK(tree.exe(202) == "/opt/train");
  auto gone = tree.stack_targets(999);  // ended before it could be read
  CHECK(gone.python.empty());
  CHECK(gone.native == 999);
  CHECK(tree.subtree(999).empty());
  CHECK(ProcessTree::read(proc.root + "/missing").subtree(1).empty());
}

TEST_CASE("process tree: the real /proc shows a shell's child below it", "[units]") {
  auto p = spawn_process({"/bin/sh", "-c", "sleep 30 & echo $!; wait"}, {"PATH=/usr/bin:/bin"});
  char buf[64] = {};
  ssize_t n = ::read(p.stdout_fd, buf, sizeof(buf) - 1);  // the child exists once its pid is told
  REQUIRE(n > 0);
  pid_t child = static_cast<pid_t>(std::atol(buf));
  auto tree = ProcessTree::read();
  auto sub = tree.subtree(p.pid);
  CHECK(std::find(sub.begin(), sub.end(), child) != sub.end());
  CHECK(tree.stack_targets(p.pid).native == child);  // sh waits for its only child
  ::kill(-p.pid, SIGKILL);
  int st = 0;
  ::waitpid(p.pid, &st, 0);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
}
