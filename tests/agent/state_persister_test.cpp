// StatePersister (workers/state_persister.hpp): a worker's persist request, written into its
// area's header, answered by the agent's thread with a file of the generation asked for.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/state_layout.hpp"
#include "workers/state_areas.hpp"
#include "workers/state_persister.hpp"

using namespace ddprun::agent;
namespace sl = ddprun::state_layout;
namespace fs = std::filesystem;

namespace {

const std::size_t kPage = sl::page();

void put(int fd, const std::vector<unsigned char>& bytes, std::uint64_t at) {
  REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(at)) == static_cast<ssize_t>(bytes.size()));
}

template <class T>
void put(int fd, T v, std::uint64_t at) {
  std::vector<unsigned char> b(sizeof(T));
  sl::write_at(b.data(), v);
  put(fd, b, at);
}

template <class T>
T get(int fd, std::uint64_t at) {
  unsigned char b[sizeof(T)];
  REQUIRE(::pread(fd, b, sizeof(T), static_cast<off_t>(at)) == static_cast<ssize_t>(sizeof(T)));
  return sl::read_at<T>(b);
}

// A rank's area as a worker's save leaves it: `slot` holds generation `gen` at `step`, its payload
// `fill` bytes of `fill`'s value (committed when `commit`).
struct Area {
  Area() : owned(std::make_unique<StateAreas>(1, 8 << 20)), areas(*owned), fd(areas.fd(0)) {}
  Area(const StateAreas& node, int local_rank) : areas(node), fd(node.fd(local_rank)) {}  // one of a node's ranks

  std::unique_ptr<StateAreas> owned;
  const StateAreas& areas;
  int fd;
  std::uint64_t slot_bytes = (areas.bytes_per_rank() - kPage) / sl::kSlots / kPage * kPage;

  std::uint64_t slot_at(int slot) const { return kPage + static_cast<std::uint64_t>(slot) * slot_bytes; }

  void save(int slot, std::uint64_t gen, std::int64_t step, unsigned char fill, bool commit = true) {
    std::vector<unsigned char> head(kPage, 0);
    sl::write_header(head.data(), sl::kSlots, slot_bytes, gen << 1 | static_cast<std::uint64_t>(slot));
    put(fd, std::vector<unsigned char>(head.begin(), head.begin() + sl::kHeaderBytes), 0);
    std::vector<unsigned char> s(kPage, 0);
    sl::write_at(s.data(), commit ? gen : 0);
    sl::write_at(s.data() + 8, gen);
    sl::write_at(s.data() + 16, step);
    sl::write_at(s.data() + 24, std::uint64_t{64});  // skeleton
    sl::write_at(s.data() + 32, std::uint64_t{1000});  // data
    put(fd, s, slot_at(slot));
    put(fd, std::vector<unsigned char>(64 + 1000, fill), slot_at(slot) + kPage);
  }
  void commit(int slot, std::uint64_t gen) { put(fd, gen, slot_at(slot)); }

  // A whole request (a sequence lock: odd while written), as ddprun.state.persist writes one.
  std::uint64_t request(std::uint64_t gen, const std::string& path) {
    auto number = get<std::uint64_t>(fd, sl::kRequestAt);
    number += number & 1;
    put(fd, number + 1, sl::kRequestAt);
    std::vector<unsigned char> r(24 + path.size(), 0);
    sl::write_at(r.data(), number + 1);
    sl::write_at(r.data() + 8, gen);
    sl::write_at(r.data() + 16, static_cast<std::uint32_t>(path.size()));
    std::memcpy(r.data() + 24, path.data(), path.size());
    put(fd, r, sl::kRequestAt);
    put(fd, number + 2, sl::kRequestAt);
    return number + 2;
  }
  // The agent's loop finds the first request and starts the persister's threads.
  static void ask(StatePersister& persister) { REQUIRE(persister.asked()); }
  // The answer to request `number` within `limit`: (step, errno, message); errno -1: none came.
  std::tuple<std::int64_t, int, std::string> answer(std::uint64_t number, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (get<std::uint64_t>(fd, sl::kReplyAt) < number) {
      if (std::chrono::steady_clock::now() > end) return {-1, -1, ""};
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::vector<unsigned char> m(sl::kReplyMessageBytes);
    REQUIRE(::pread(fd, m.data(), m.size(), sl::kReplyAt + 24) == static_cast<ssize_t>(m.size()));
    return {get<std::int64_t>(fd, sl::kReplyAt + 8), get<std::int32_t>(fd, sl::kReplyAt + 16),
            std::string(reinterpret_cast<char*>(m.data()), get<std::uint32_t>(fd, sl::kReplyAt + 20))};
  }
  unsigned char pinned() {
    std::vector<unsigned char> head(kPage);
    REQUIRE(::pread(fd, head.data(), kPage, 0) == static_cast<ssize_t>(kPage));
    return static_cast<unsigned char>(sl::pinned_generation(head.data()));
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("persist_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("state persister: the generation asked for is written whole as a one-slot file, a bad path refused with the earlier file kept", "[units]") {
  Area area;
  TempDir dir;
  const std::string target = (dir.path / "rank0.state").string();
  StatePersister persister(area.areas, std::chrono::milliseconds(10));
  CHECK_FALSE(persister.asked());  // nothing asked: no thread
  area.save(0, 1, 10, 'a');
  area.save(1, 2, 11, 'b');
  // Generation 1, not the newest: the file holds step 10 and its bytes.
  auto number = area.request(1, target);
  Area::ask(persister);
  auto [step, err, message] = area.answer(number, std::chrono::seconds(10));
  INFO(message);
  REQUIRE(err == 0);
  CHECK(step == 10);
  CHECK(area.pinned() == 0);  // copied: the saves may use the slot again
  std::string file = slurp(target);
  REQUIRE(file.size() >= 2 * kPage + 64 + 1000);
  const auto* bytes = reinterpret_cast<const unsigned char*>(file.data());
  const auto head = sl::header(bytes);
  CHECK(head.magic);
  CHECK(head.slots == 1);
  CHECK(head.latest == 1u << 1);
  CHECK(file.size() == kPage + head.slot_bytes);
  const auto slot = sl::slot_header(bytes + kPage);
  CHECK(slot.committed_within(head.slot_bytes));
  CHECK(slot.step == 10);
  CHECK(file.substr(2 * kPage, 1064) == std::string(1064, 'a'));
  CHECK((fs::status(target).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));

  // A relative path, a missing folder, a generation overwritten: refused saying why; the file
  // written above is as it was, and nothing else is left in its folder.
  for (const auto& [gen, path, why] : {std::tuple<std::uint64_t, std::string, std::string>{2, "rank0.state", "absolute path"},
                                       {2, (dir.path / "no" / "rank0.state").string(), "No such file or directory"},
                                       {0, target, "overwritten before it was copied"}}) {
    number = area.request(gen, path);
    std::tie(step, err, message) = area.answer(number, std::chrono::seconds(10));
    CHECK(err > 0);
    CHECK_THAT(message, Catch::Contains(why) && Catch::Contains("earlier file there is kept"));
  }
  CHECK(slurp(target) == file);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}) == 1);
}

TEST_CASE("state persister: a request for a save still being copied waits for its commit, and at the end is answered that it never was", "[units]") {
  Area area;
  TempDir dir;
  const std::string target = (dir.path / "rank0.state").string();
  {
    StatePersister persister(area.areas, std::chrono::milliseconds(10));
    area.save(0, 1, 10, 'a');
    area.save(1, 2, 11, 'b', /*commit=*/false);  // the worker's thread still copies step 11
    auto number = area.request(2, target);
    Area::ask(persister);
    CHECK(std::get<1>(area.answer(number, std::chrono::milliseconds(300))) == -1);  // not answered
    CHECK(area.pinned() == 2);
    area.commit(1, 2);
    auto [step, err, message] = area.answer(number, std::chrono::seconds(10));
    INFO(message);
    CHECK(err == 0);
    CHECK(step == 11);
    CHECK(slurp(target).substr(2 * kPage, 1064) == std::string(1064, 'b'));
    // A worker that dies mid-save: its request is kept until the agent ends.
    area.save(0, 3, 12, 'c', /*commit=*/false);
    area.request(3, target);
  }
  auto [step, err, message] = area.answer(4, std::chrono::seconds(1));
  CHECK(err == ECANCELED);
  CHECK_THAT(message, Catch::Contains("never completed"));
  CHECK(slurp(target).substr(2 * kPage, 1064) == std::string(1064, 'b'));
}

TEST_CASE("state persister: a request made just before the agent ends, before its loop looked, is served at the end", "[units]") {
  Area area;
  TempDir dir;
  const std::string target = (dir.path / "rank0.state").string();
  area.save(0, 1, 10, 'a');
  std::uint64_t number = 0;
  {
    StatePersister persister(area.areas, std::chrono::milliseconds(10));
    number = area.request(1, target);
  }  // never asked(): the destructor starts the threads for their last pass
  auto [step, err, message] = area.answer(number, std::chrono::seconds(1));
  INFO(message);
  CHECK(err == 0);
  CHECK(step == 10);
  CHECK(fs::exists(target));
}

TEST_CASE("state persister: two ranks persisting one step to one path - the first writes it, the other is refused saying each rank needs its own file", "[units]") {
  StateAreas node(2, 16 << 20);
  Area rank0(node, 0), rank1(node, 1);
  TempDir dir;
  const std::string shared = (dir.path / "latest.state").string();
  StatePersister persister(node, std::chrono::milliseconds(10));
  rank0.save(0, 1, 100, 'a');
  rank1.save(0, 1, 100, 'b');
  auto first = rank0.request(1, shared);
  Area::ask(persister);
  auto [step, err, message] = rank0.answer(first, std::chrono::seconds(10));
  REQUIRE(err == 0);
  auto second = rank1.request(1, shared);
  std::tie(step, err, message) = rank1.answer(second, std::chrono::seconds(10));
  CHECK(err == EEXIST);
  CHECK_THAT(message, Catch::Contains("local rank 0 persisted its state of step 100 to this path") &&
                          Catch::Contains("every rank needs a file of its own"));
  CHECK(slurp(shared).substr(2 * kPage, 1064) == std::string(1064, 'a'));  // rank 0's, whole
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}) == 1);

  // Files of their own: both written. The path at a later step from the other rank (the ranks
  // placed anew on the nodes): written.
  const std::string own = (dir.path / "rank1.state").string();
  std::tie(step, err, message) = rank1.answer(rank1.request(1, own), std::chrono::seconds(10));
  CHECK(err == 0);
  rank1.save(1, 2, 200, 'c');
  std::tie(step, err, message) = rank1.answer(rank1.request(2, shared), std::chrono::seconds(10));
  INFO(message);
  CHECK(err == 0);
  CHECK(step == 200);
  CHECK(slurp(shared).substr(2 * kPage, 1064) == std::string(1064, 'c'));
}
