// StateAreas (workers/state_areas.hpp): one sealed memfd per local rank, of its share of the
// budget, given to a worker as descriptor kStateFd and nothing else of the agent's.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "ddprun/agent/spawn.hpp"
#include "workers/state_areas.hpp"

using namespace ddprun::agent;

namespace {

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) s.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return s;
}

}  // namespace

TEST_CASE("state areas: one per local rank, its share of the budget, sealed to that size", "[units]") {
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  StateAreas areas(2, (64ULL << 20) + page);  // an odd budget: each share rounded down to pages
  REQUIRE(areas.ranks() == 2);
  CHECK(areas.bytes_per_rank() == 32ULL << 20);
  CHECK(areas.fd(2) == -1);
  for (int r = 0; r < 2; ++r) {
    const int fd = areas.fd(r);
    struct stat st{};
    REQUIRE(::fstat(fd, &st) == 0);
    CHECK(static_cast<std::uint64_t>(st.st_size) == areas.bytes_per_rank());
    CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);  // given to a worker only as kStateFd
    CHECK(::fcntl(fd, F_GET_SEALS) == (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL));
    CHECK(::ftruncate(fd, st.st_size * 2) != 0);  // no worker takes more than its share
    CHECK(::ftruncate(fd, 0) != 0);               // nor takes the area from the next attempt
    CHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0);
    CHECK(::pwrite(fd, "x", 1, st.st_size) != 1);
    CHECK(::pwrite(fd, "x", 1, st.st_size - 1) == 1);
    char link[64] = {};
    REQUIRE(::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof(link) - 1) > 0);
    CHECK(std::string(link).rfind("/memfd:ddprun-state-" + std::to_string(r), 0) == 0);
  }
  CHECK(areas.resident_bytes() == 2 * page);  // sparse: only the pages written
}

TEST_CASE("state areas: none for a zero budget", "[units]") {
  StateAreas none(4, 0);
  CHECK(none.ranks() == 0);
  CHECK(none.fd(0) == -1);
  CHECK(usable_memory_bytes() > 0);
}

TEST_CASE("spawn: the state area becomes the worker's descriptor 5, beside 0-2 only", "[units]") {
  StateAreas areas(1, 1 << 20);
  auto p = spawn_process({"/bin/sh", "-c", "readlink /proc/$$/fd/5; exec ls /proc/self/fd"}, {}, nullptr, nullptr, -1,
                         -1, areas.fd(0));
  std::string out = read_all(p.stdout_fd);
  ::close(p.stderr_fd);
  int status = 0;
  REQUIRE(::waitpid(p.pid, &status, 0) == p.pid);
  CHECK(out.rfind("/memfd:ddprun-state-0", 0) == 0);
  CHECK(out.substr(out.find('\n') + 1) == "0\n1\n2\n3\n5\n");  // 3: ls's own listing of the folder
  CHECK(kStateFd == 5);
}
