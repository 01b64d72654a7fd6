// A native trainer's in-memory state (ddprun/runtime/memory_state.hpp) in one process, without
// ddprun: a memfd made here as the agent makes it, handed through DDPRUN_STATE_FD/_BYTES.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/runtime/memory_state.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "group_fixture.hpp"

using namespace ddprun::runtime;

namespace {

// An area of `bytes`, as the agent makes one (memfd "ddprun-state-..."), in the environment.
struct Area {
  int fd;
  std::size_t bytes;
  explicit Area(std::size_t b) : fd(::memfd_create("ddprun-state-0", MFD_CLOEXEC)), bytes(b) {
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(b)) == 0);
    ::setenv("DDPRUN_STATE_FD", std::to_string(fd).c_str(), 1);
    ::setenv("DDPRUN_STATE_BYTES", std::to_string(b).c_str(), 1);
  }
  ~Area() {
    ::unsetenv("DDPRUN_STATE_FD");
    ::unsetenv("DDPRUN_STATE_BYTES");
    ::close(fd);
  }
  // The byte at `offset` of the area, flipped.
  void flip(std::size_t offset) {
    unsigned char c;
    REQUIRE(::pread(fd, &c, 1, static_cast<off_t>(offset)) == 1);
    c ^= 0xff;
    REQUIRE(::pwrite(fd, &c, 1, static_cast<off_t>(offset)) == 1);
  }
  void zero(std::size_t offset, std::size_t n) {
    std::vector<unsigned char> z(n, 0);
    REQUIRE(::pwrite(fd, z.data(), n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n));
  }
};

std::vector<float> values(float from, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("memory state: saves alternate between two slots, the newest two steps held, each loaded as saved, a negative step refused", "[state]") {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  Area area(1 << 20);
  MemoryState s;
  REQUIRE(s.available());
  CHECK(s.capacity() == (area.bytes - page) / 2 / page * page - page);
  CHECK(s.steps().empty());
  auto w = values(1, 1000), m = values(-5, 3);
  s.save(0, {{"w", w.data(), w.size() * 4}, {"moments", m.data(), m.size() * 4}, {"empty", nullptr, 0}});
  w[0] = 42;
  s.save(1, {{"w", w.data(), w.size() * 4}, {"moments", m.data(), m.size() * 4}, {"empty", nullptr, 0}});
  w[0] = 43;
  s.save(2, {{"w", w.data(), w.size() * 4}, {"moments", m.data(), m.size() * 4}, {"empty", nullptr, 0}});
  CHECK(s.steps() == std::vector<std::int64_t>{2, 1});
  auto one = s.load_step(1);
  REQUIRE(one);
  CHECK(one->step == 1);
  REQUIRE(one->buffers.at("w").size() == w.size() * 4);
  float first;
  std::memcpy(&first, one->buffers.at("w").data(), 4);
  CHECK(first == 42);
  CHECK(std::memcmp(one->buffers.at("moments").data(), m.data(), m.size() * 4) == 0);
  CHECK(one->buffers.at("empty").empty());
  CHECK_FALSE(s.load_step(0));  // overwritten by step 2
  // A second MemoryState over the same area (the next worker) sees what this one committed.
  MemoryState next;
  CHECK(next.steps() == std::vector<std::int64_t>{2, 1});
  // A negative step is refused (no agreement would take it), the state kept.
  CHECK_THROWS_WITH(next.save(-1, {{"w", w.data(), w.size() * 4}}), Catch::Contains("step -1 is negative"));
  CHECK(next.steps() == std::vector<std::int64_t>{2, 1});
}

TEST_CASE("memory state: a save killed midway leaves the previous state whole, a flipped byte fails the CRC-32, too large is refused", "[state]") {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  Area area(1 << 20);
  MemoryState s;
  auto w = values(1, 100);
  s.save(7, {{"w", w.data(), w.size() * 4}});
  s.save(8, {{"w", w.data(), w.size() * 4}});
  const std::size_t slot_bytes = (area.bytes - page) / 2 / page * page;
  // Step 8 is in slot 1. A save's first write clears its slot's commit word: killed after it,
  // that slot holds nothing, and step 7 is whole.
  area.zero(page + slot_bytes, 8);
  CHECK(s.steps() == std::vector<std::int64_t>{7});
  REQUIRE(s.load_step(7));
  // The next save goes to the slot that does not hold step 7.
  s.save(9, {{"w", w.data(), w.size() * 4}});
  CHECK(s.steps() == std::vector<std::int64_t>{9, 7});
  area.flip(2 * page + 100);  // a byte of step 7's payload (slot 0 at a page, its payload a page after)
  CHECK_THROWS_WITH(s.load_step(7), Catch::Contains("fails its CRC-32 check"));
  // Too large for a slot: refused, naming --state_memory; what was held stays.
  std::vector<unsigned char> big(s.capacity() + 1);
  CHECK_THROWS_WITH(s.save(10, {{"big", big.data(), big.size()}}), Catch::Contains("--state_memory"));
  CHECK(s.steps() == std::vector<std::int64_t>{9, 7});
}

TEST_CASE("memory state: a save waits to write the slot a persist request pins until the agent has copied it, and never reuses a requested generation", "[state]") {
  Area area(1 << 20);
  MemoryState s;
  auto w = values(1, 100);
  s.save(1, {{"w", w.data(), w.size() * 4}});  // generation 1, slot 0
  s.save(2, {{"w", w.data(), w.size() * 4}});  // generation 2, slot 1
  // A request (number 2, whole) for generation 1, as persist() writes one; no agent copies it yet.
  auto put = [&](std::uint64_t v, std::size_t at) {
    REQUIRE(::pwrite(area.fd, &v, 8, static_cast<off_t>(at)) == 8);
  };
  put(1, 2048 + 8);
  put(2, 2048);
  std::atomic<bool> saved{false};
  std::thread saver([&] {
    s.save(3, {{"w", w.data(), w.size() * 4}});  // goes to slot 0, which holds generation 1
    saved = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(saved);
  CHECK(s.steps() == std::vector<std::int64_t>{2, 1});  // both committed states still whole
  put(2, 1536);  // the agent's "copied" for request 2
  saver.join();
  CHECK(saved);
  CHECK(s.steps() == std::vector<std::int64_t>{3, 2});
  // No agent answers the next request: a blocking persist with a time-out says so once it is out.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", true, std::chrono::milliseconds(200)),
                    Catch::Contains("had not written /tmp/never.state after 200 ms"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", false, std::chrono::milliseconds(200)), Catch::Contains("needs blocking"));
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", true, std::chrono::milliseconds(-1)), Catch::Contains("needs blocking"));
  put(4, 1536);  // the agent's "copied" for it
  // A request that named generation 9 (a save that never ended): the next save is generation 10.
  put(9, 2048 + 8);
  put(4, 2048);
  put(4, 1536);
  s.save(4, {{"w", w.data(), w.size() * 4}});
  std::uint64_t latest = 0;
  REQUIRE(::pread(area.fd, &latest, 8, 24) == 8);
  CHECK(latest >> 1 == 10);
}

TEST_CASE("memory state: while the agent copies the saves to a buddy node, a save waits until the last one has been replicated - at once when it has, never with the copies off", "[state]") {
  // 1544: replicated, the newest generation of the area whose step every rank's buddy holds;
  // 1552: copies, 1 while the agent copies the area's saves to a buddy node. The area's newest
  // committed generation is the header's latest >> 1 (at 24).
  Area area(1 << 20);
  MemoryState s;
  auto w1 = values(1, 100), w2 = values(2, 100), w3 = values(3, 100);
  s.save(1, {{"w", w1.data(), w1.size() * 4}});
  s.save(2, {{"w", w2.data(), w2.size() * 4}});
  auto put = [&](std::uint64_t v, std::size_t offset) {
    REQUIRE(::pwrite(area.fd, &v, 8, static_cast<off_t>(offset)) == 8);
  };
  auto newest = [&] {
    std::uint64_t latest = 0;
    REQUIRE(::pread(area.fd, &latest, 8, 24) == 8);
    return latest >> 1;
  };
  const std::uint64_t two = newest();
  REQUIRE(two > 1);

  // Copies on, the newest state not replicated: the save waits, both committed states whole.
  put(two - 1, 1544);
  put(1, 1552);
  std::atomic<bool> saved{false};
  std::thread saver([&] {
    s.save(3, {{"w", w3.data(), w3.size() * 4}});
    saved = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(saved);
  CHECK(s.steps() == std::vector<std::int64_t>{2, 1});
  {
    // Both committed states whole (their CRC-32s checked), read as the next worker would.
    MemoryState reader;
    auto one = reader.load_step(1), second = reader.load_step(2);
    REQUIRE(one);
    REQUIRE(second);
    CHECK(std::memcmp(one->buffers.at("w").data(), w1.data(), w1.size() * 4) == 0);
    CHECK(std::memcmp(second->buffers.at("w").data(), w2.data(), w2.size() * 4) == 0);
  }
  put(two, 1544);  // the agent: the newest state has reached every rank's buddy
  saver.join();
  CHECK(saved);
  CHECK(s.steps() == std::vector<std::int64_t>{3, 2});

  // Copies on, the newest state replicated: a save goes on at once.
  put(newest(), 1544);
  auto t0 = std::chrono::steady_clock::now();
  s.save(4, {{"w", w1.data(), w1.size() * 4}});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", false, std::chrono::milliseconds(200)), Catch::Contains("needs blocking"));
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", true, std::chrono::milliseconds(-1)), Catch::Contains("needs blocking"));
  CHECK(s.steps() == std::vector<std::int64_t>{4, 3});

  // Copies off: never a wait, however old replicated is.
  put(0, 1552);
  put(1, 1544);
  REQUIRE(newest() > 1);
  t0 = std::chrono::steady_clock::now();
  s.save(5, {{"w", w2.data(), w2.size() * 4}});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", false, std::chrono::milliseconds(200)), Catch::Contains("needs blocking"));
  CHECK_THROWS_WITH(s.persist("/tmp/never.state", true, std::chrono::milliseconds(-1)), Catch::Contains("needs blocking"));
  CHECK(s.steps() == std::vector<std::int64_t>{5, 4});
  auto five = s.load_step(5);
  REQUIRE(five);
  CHECK(std::memcmp(five->buffers.at("w").data(), w2.data(), w2.size() * 4) == 0);
}

TEST_CASE("memory state: without an area nothing is saved or loaded, and a descriptor that is not one is refused", "[state]") {
  {
    MemoryState none;
    CHECK_FALSE(none.available());
    float x = 1;
    none.save(1, {{"x", &x, 4}});
    CHECK(none.steps().empty());
    CHECK_FALSE(none.load_step(1));
  }
  ::setenv("DDPRUN_STATE_FD", "0", 1);  // stdin: inherited variables, not the memfd
  ::setenv("DDPRUN_STATE_BYTES", "1048576", 1);
  MemoryState refused;  // says so on stderr, once
  CHECK_FALSE(refused.available());
  float x = 1;
  refused.save(1, {{"x", &x, 4}});
  CHECK(refused.steps().empty());
  ::unsetenv("DDPRUN_STATE_FD");
  ::unsetenv("DDPRUN_STATE_BYTES");
}

namespace {

// Runs body(rank, group, state) in `world` forked processes, each with an area of its own and
// RANK/WORLD_SIZE set as ddprun sets them, in a gloo group through `ranks`' store. Each child's
// exit code: 0 where body returned true (a child reports through it: Catch checks live in the parent).
std::vector<int> in_processes(int world, const std::function<bool(int, ProcessGroup&, MemoryState&)>& body) {
  static ddprun::test::Ranks ranks;
  static int group = 0;
  const std::string prefix = "state" + std::to_string(group++);
  std::fflush(nullptr);  // nothing buffered written twice by the children
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid > 0) {
      pids.push_back(pid);
      continue;
    }
    ::alarm(60);  // never a hang in the parent's wait
    int code = 3;
    try {
      const int fd = ::memfd_create("ddprun-state-0", MFD_CLOEXEC);
      if (fd < 0 || ::ftruncate(fd, 4 << 20) != 0) ::_exit(4);
      ::setenv("DDPRUN_STATE_FD", std::to_string(fd).c_str(), 1);
      ::setenv("DDPRUN_STATE_BYTES", std::to_string(4 << 20).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      MemoryState state;
      auto pg = create_process_group("gloo", ranks.store(prefix), r, world);
      code = body(r, *pg, state) ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      code = 2;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

std::vector<unsigned char> bytes_of(const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  return {p, p + v.size() * sizeof(float)};
}

}  // namespace

TEST_CASE("memory state: replicated buffers shared out by RANK of WORLD_SIZE, each rank copying its range, gathered by load(group), and a step saved in two courses not agreed on", "[state]") {
  const auto codes = in_processes(3, [](int rank, ProcessGroup& group, MemoryState& s) {
    bool ok = true;
    auto expect = [&](bool c, const char* what) {
      if (!c) std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what);
      ok = ok && c;
    };
    const auto w = values(1, 10000), mine = values(static_cast<float>(100 * rank), 16);
    s.save(0, {{"w", w.data(), w.size() * 4}, {"mine", mine.data(), mine.size() * 4}});
    const auto whole = s.last_bytes();
    s.save(1, {{"w", w.data(), w.size() * 4, true}, {"mine", mine.data(), mine.size() * 4}});
    // A third of w's 40000 bytes (within 64-byte bounds), its own buffer, the structure.
    expect(s.last_bytes() + 40000 * 2 / 3 - 256 < whole, "a save holds a third of the replicated buffer");
    const auto loaded = s.load(group);
    expect(loaded && loaded->step == 1, "the ranks agree on step 1");
    expect(loaded && loaded->buffers.at("w") == bytes_of(w), "each rank gathers the whole replicated buffer");
    expect(loaded && loaded->buffers.at("mine") == bytes_of(mine), "each rank's own buffer is its own");
    // Rank 1's next save is of another round's course (the agent starts each round's generations
    // at round << 40): the ranks hold step 3 in two courses, and agree on step 2.
    s.save(2, {{"w", w.data(), w.size() * 4, true}});
    if (rank == 1) {
      const int fd = std::atoi(std::getenv("DDPRUN_STATE_FD"));
      std::uint64_t latest = 0;
      if (::pread(fd, &latest, 8, 24) != 8) return false;
      latest = std::max(latest >> 1, std::uint64_t{1} << 40) << 1 | (latest & 1);
      if (::pwrite(fd, &latest, 8, 24) != 8) return false;
    }
    s.save(3, {{"w", w.data(), w.size() * 4, true}});
    const auto again = s.load(group);
    expect(again && again->step == 2, "a step saved in two courses: the ranks agree on the step before");
    return ok;
  });
  CHECK(codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("memory state: load(group, path) loads a persisted file - a FIFO or a directory there loads nothing, at once", "[state]") {
  namespace sl = ddprun::state_layout;
  const std::string dir = "/tmp/ddprun-state-files-" + std::to_string(::getpid());
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  const auto codes = in_processes(2, [&](int rank, ProcessGroup& group, MemoryState& s) {
    bool ok = true;
    auto expect = [&](bool c, const char* what) {
      if (!c) std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what);
      ok = ok && c;
    };
    const auto w = values(static_cast<float>(10 * rank), 5000);
    s.save(5, {{"w", w.data(), w.size() * 4}});
    s.wait();
    // The file persist() has the agent write: a header page for one slot, then the slot (here
    // the area's whole first slot, where the first save went).
    const int fd = std::atoi(std::getenv("DDPRUN_STATE_FD"));
    const std::uint64_t slot_bytes = sl::area_slot_bytes(4 << 20);
    std::vector<unsigned char> file(sl::page() + slot_bytes, 0);
    sl::write_header(file.data(), 1, slot_bytes, std::uint64_t{1} << 1);
    if (::pread(fd, file.data() + sl::page(), slot_bytes, static_cast<off_t>(sl::page())) != static_cast<ssize_t>(slot_bytes)) return false;
    const std::string path = dir + "/rank" + std::to_string(rank) + ".state";
    const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0 || ::write(out, file.data(), file.size()) != static_cast<ssize_t>(file.size())) return false;
    ::close(out);
    const auto loaded = MemoryState::load(group, path);
    expect(loaded && loaded->step == 5 && loaded->buffers.at("w") == bytes_of(w), "each rank loads its file's state");
    const std::string fifo = dir + "/fifo" + std::to_string(rank);
    if (::mkfifo(fifo.c_str(), 0600) != 0) return false;
    for (const auto& bad : {fifo, dir}) {
      const auto t0 = std::chrono::steady_clock::now();
      expect(!MemoryState::load(group, bad), "a FIFO or a directory: nothing loaded");
      expect(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5), "... at once (a FIFO is not waited on)");
    }
    return ok;
  });
  CHECK(codes == std::vector<int>{0, 0});
  std::filesystem::remove_all(dir);
}
