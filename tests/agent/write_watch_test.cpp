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

namespace {

// A worker: a process that waits; below it, a writer that writes 16 MB to a file on disk
// (/var/tmp: write_bytes counts what a disk's pages take, not a tmpfs's) each time it is told.
class Writer {
 public:
  Writer() : path_("/var/tmp/ddprun-write-watch-" + std::to_string(::getpid()) + "-" + std::to_string(count_++)) {
    REQUIRE(::pipe(go_) == 0);
    REQUIRE(::pipe(done_) == 0);
    worker = ::fork();
    REQUIRE(worker >= 0);
    if (worker == 0) {
      if (::fork() == 0) write_when_told();
      ::pause();
      ::_exit(0);
    }
    // The writer is below the worker once the worker has forked it.
    for (int i = 0; i < 200 && below.size() < 2; ++i) {
      below = with_descendants(worker);
      if (below.size() < 2) ::usleep(10000);
    }
    REQUIRE(below.size() == 2);
  }
  ~Writer() {
    ::kill(worker, SIGKILL);
    for (pid_t p : below) ::kill(p, SIGKILL);
    ::waitpid(worker, nullptr, 0);
    ::unlink(path_.c_str());
    for (int fd : {go_[0], go_[1], done_[0], done_[1]}) ::close(fd);
  }
  void write_16mb() {
    REQUIRE(::write(go_[1], "g", 1) == 1);
    char c;
    REQUIRE(::read(done_[0], &c, 1) == 1);
  }

  pid_t worker = -1;
  std::vector<pid_t> below;

 private:
  [[noreturn]] void write_when_told() {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char> block(1 << 20, 'x');
    char c;
    while (fd >= 0 && ::read(go_[0], &c, 1) == 1) {
      for (int i = 0; i < 16; ++i) {
        if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) ::_exit(1);
      }
      ::fsync(fd);
      if (::write(done_[1], "d", 1) != 1) ::_exit(1);
    }
    ::_exit(1);
  }

  static inline int count_ = 0;
  std::string path_;
  int go_[2], done_[2];
};

}  // namespace

TEST_CASE("write watch: a save written by a process below the worker's, its main thread still, is a save", "[units]") {
  Writer w;
  CHECK(w.below[0] == w.worker);
  WriteWatch watch;
  const auto t0 = WriteWatch::Clock::now();
  watch.look(w.worker, t0, true, false, t0);  // the baseline
  w.write_16mb();
  const auto own = storage_written(w.worker), all = storage_written_below(w.worker);
  REQUIRE(own.has_value());
  REQUIRE(all.has_value());
  INFO("the worker's own write_bytes " << *own << ", with the writer's " << *all);
  CHECK(*all >= *own + (16u << 20));
  watch.look(w.worker, t0, true, false, t0 + 3s);  // 16 MB in 3 s, its main thread still
  CHECK(watch.saving(t0 + 3s));
  CHECK(watch.wrote_lately(t0 + 3s));
  CHECK_FALSE(watch.saving(t0 + 3s + kFlushGrace + 1s));
}

TEST_CASE("write watch: a save that began before its main thread was seen still is not taken for its pace", "[units]") {
  // Its last step seen at t0 + 1 s; at t0 + 2 s its silence is too short to call it still, and the
  // window then holds the save's first 16 MB. No step follows that window: it is no pace, and the
  // save's next 16 MB, at the same pace, is a save (taken for the pace, 8 MB/s, it would put the
  // bar at 4 x 8 MB/s x 2 s = 64 MB).
  Writer w;
  WriteWatch watch;
  const auto t0 = WriteWatch::Clock::now();
  watch.look(w.worker, t0, false, false, t0);
  w.write_16mb();
  watch.look(w.worker, t0 + 1s, false, false, t0 + 2s);
  w.write_16mb();
  watch.look(w.worker, t0 + 1s, true, false, t0 + 4s);
  CHECK(watch.saving(t0 + 4s));

  // A window that ends at the look where a step is seen may hold what followed it: it counts
  // only once a later step is seen.
  Writer at_step;
  WriteWatch boundary;
  boundary.look(at_step.worker, t0, false, false, t0);
  at_step.write_16mb();
  boundary.look(at_step.worker, t0 + 2s, false, false, t0 + 2s);
  at_step.write_16mb();
  boundary.look(at_step.worker, t0 + 2s, true, false, t0 + 4s);
  CHECK(boundary.saving(t0 + 4s));

  // Its pace, from a window a step was seen after, counts: the same 16 MB in 3 s is no save.
  Writer logs;
  WriteWatch paced;
  paced.look(logs.worker, t0, false, false, t0);
  logs.write_16mb();
  paced.look(logs.worker, t0 + 1s, false, false, t0 + 2s);
  paced.look(logs.worker, t0 + 3s, false, false, t0 + 3s);  // a step after the window
  logs.write_16mb();
  paced.look(logs.worker, t0 + 3s, true, false, t0 + 5s);
  CHECK_FALSE(paced.saving(t0 + 5s));
}

TEST_CASE("write watch: what a save writes after its main thread steps again is no pace", "[units]") {
  // Still from t0 (a save), its last 16 MB written as the thread steps again at t0 + 4 s: the
  // window that holds them is dropped, the next (nothing written) is its pace, and a later save
  // of 16 MB in 3 s is a save (4 MB/s learned from the tail would put the bar at 48 MB).
  Writer w;
  WriteWatch watch;
  const auto t0 = WriteWatch::Clock::now();
  watch.look(w.worker, t0, false, false, t0);
  watch.look(w.worker, t0, true, false, t0 + 3s);
  w.write_16mb();
  watch.look(w.worker, t0 + 4s, false, false, t0 + 4s);
  watch.look(w.worker, t0 + 5s, false, false, t0 + 6s);
  watch.look(w.worker, t0 + 7s, false, false, t0 + 7s);
  w.write_16mb();
  watch.look(w.worker, t0 + 7s, true, false, t0 + 9s);
  CHECK(watch.saving(t0 + 9s));
}
