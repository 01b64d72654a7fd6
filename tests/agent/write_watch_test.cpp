// WriteWatch (workers/write_watch.hpp): a save's writes seen as the agent sees them, through the
// real /proc, by the worker's training process or a process of its own below it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "workers/write_watch.hpp"

using namespace ddprun::agent;
using namespace std::chrono_literals;

TEST_CASE("write watch: a save written by a process below the worker's, its main thread still, is a save", "[units]") {
  // The worker: a process that waits; below it, a writer that writes 16 MB to a file on disk
  // (/var/tmp: write_bytes counts what a disk's pages take, not a tmpfs's) when told, then waits.
  int go[2], done[2];
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(done) == 0);
  const std::string path = "/var/tmp/ddprun-write-watch-" + std::to_string(::getpid());
  const pid_t worker = ::fork();
  REQUIRE(worker >= 0);
  if (worker == 0) {
    if (::fork() == 0) {
      char c;
      if (::read(go[0], &c, 1) != 1) ::_exit(1);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      std::vector<char> block(1 << 20, 'x');
      for (int i = 0; i < 16 && fd >= 0; ++i) {
        if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) ::_exit(1);
      }
      ::close(fd);
      if (::write(done[1], "d", 1) != 1) ::_exit(1);
      ::pause();
      ::_exit(0);
    }
    ::pause();
    ::_exit(0);
  }
  // The writer is below the worker once the worker has forked it.
  std::vector<pid_t> below;
  for (int i = 0; i < 200 && below.size() < 2; ++i) {
    below = with_descendants(worker);
    if (below.size() < 2) ::usleep(10000);
  }
  REQUIRE(below.size() == 2);
  CHECK(below[0] == worker);

  WriteWatch watch;
  const auto t0 = WriteWatch::Clock::now();
  watch.look(worker, true, false, t0);  // the baseline
  REQUIRE(::write(go[1], "g", 1) == 1);
  char c;
  REQUIRE(::read(done[0], &c, 1) == 1);
  const auto own = storage_written(worker), all = storage_written_below(worker);
  REQUIRE(own.has_value());
  REQUIRE(all.has_value());
  INFO("the worker's own write_bytes " << *own << ", with the writer's " << *all);
  CHECK(*all >= *own + (16u << 20));
  watch.look(worker, true, false, t0 + 3s);  // 16 MB in 3 s, its main thread still
  CHECK(watch.saving(t0 + 3s));
  CHECK(watch.wrote_lately(t0 + 3s));
  CHECK_FALSE(watch.saving(t0 + 3s + kFlushGrace + 1s));

  ::kill(worker, SIGKILL);
  for (pid_t p : below) ::kill(p, SIGKILL);
  ::waitpid(worker, nullptr, 0);
  ::unlink(path.c_str());
  for (int fd : {go[0], go[1], done[0], done[1]}) ::close(fd);
}
