// The guardian (a forked process) and the agent's temporary directory: a guardian released
// (release(), the ordinary goodbye) leaves the directory to the agent and is gone when
// ~Guardian returns; one whose agent side closes without a goodbye (the agent died) removes it.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

#include "guardian.hpp"
#include "private_files.hpp"

using ddprun::agent::Guardian;

namespace {

// A directory with a file and a subdirectory in it, as the agent's temporary one.
std::string make_tree() {
  char tmpl[] = "/tmp/ddprun-guardian-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  REQUIRE(::mkdir((dir + "/attempt_0").c_str(), 0700) == 0);
  int fd = ::open((dir + "/attempt_0/heartbeat").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  return dir;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Whether the process `pid` is gone (not even a zombie of ours).
bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

TEST_CASE("guardian: release() leaves the directory to the agent, and the guardian is gone after ~Guardian") {
  const std::string dir = make_tree();
  pid_t pid = -1;
  {
    Guardian g;
    pid = g.pid();
    REQUIRE(pid > 0);
    g.own_directory(dir);
    g.release();
  }
  CHECK(gone(pid));
  CHECK(exists(dir + "/attempt_0/heartbeat"));
  ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: an agent gone without a goodbye - the guardian removes the directory") {
  const std::string dir = make_tree();
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    Guardian g;  // the guardian is this child's child
    g.own_directory(dir);
    _exit(g.pid() > 0 ? 0 : 1);  // no release(): the pipe's end of file
  }
  int status = 0;
  REQUIRE(::waitpid(agent, &status, 0) == agent);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  for (int i = 0; i < 500 && exists(dir); ++i) ::usleep(10'000);  // bounded: 5 s
  CHECK_FALSE(exists(dir));
}
