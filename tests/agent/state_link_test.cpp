// StateLinkServer and StateLinkClient (workers/state_link.hpp): the copies of a rank's committed
// state between agents, behind the round's copy key.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "workers/state_areas.hpp"
#include "workers/state_link.hpp"

using namespace ddprun::agent;
namespace sl = ddprun::state_layout;

namespace {

const std::size_t kPageBytes = sl::page();

// A rank's area whose slot 0 holds generation `gen` at `step`: 64 bytes of skeleton and 1000 of
// data, each byte `fill`, in two chunks with their CRC-32s (`crc_ok`: else the second is wrong).
// Returns the image's size (header page and payload).
std::uint64_t save(int fd, std::uint64_t gen, std::int64_t step, unsigned char fill, bool crc_ok = true) {
  std::vector<unsigned char> payload(64 + 1000, fill);
  std::vector<unsigned char> s(kPageBytes, 0);
  sl::write_at(s.data(), gen);
  sl::write_at(s.data() + 8, gen);
  sl::write_at(s.data() + 16, step);
  sl::write_at(s.data() + 24, std::uint64_t{64});
  sl::write_at(s.data() + 32, std::uint64_t{1000});
  sl::write_at(s.data() + 40, std::uint64_t{600});  // chunk bytes
  sl::write_at(s.data() + 48, std::uint32_t{2});
  sl::write_at(s.data() + 52, static_cast<std::uint32_t>(::crc32(0, payload.data(), 600)));
  sl::write_at(s.data() + 56, static_cast<std::uint32_t>(::crc32(crc_ok ? 0 : 1, payload.data() + 600, 464)));
  REQUIRE(::pwrite(fd, s.data(), s.size(), static_cast<off_t>(kPageBytes)) == static_cast<ssize_t>(s.size()));
  REQUIRE(::pwrite(fd, payload.data(), payload.size(), static_cast<off_t>(2 * kPageBytes)) ==
          static_cast<ssize_t>(payload.size()));
  return kPageBytes + payload.size();
}

std::atomic<bool> no_stop{false};

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

bool put(StateLinkServer& server, const std::string& key, int rank, int fd, std::uint64_t bytes, bool intact = true) {
  StateLinkClient c("127.0.0.1", server.port(), key);
  return c.put(rank, fd, kPageBytes, bytes, 0, no_stop, [&] { return intact; });
}

}  // namespace

TEST_CASE("state link: a put is kept whole and got back, the two newest of a rank are kept", "[state]") {
  StateAreas area(1, 4 << 20);
  StateLinkServer server(1 << 20);
  server.start();
  server.set_key("the round's key");
  for (std::uint64_t gen = 1; gen <= 3; ++gen) {
    const auto bytes = save(area.fd(0), gen, static_cast<std::int64_t>(gen * 10), static_cast<unsigned char>(gen));
    REQUIRE(put(server, "the round's key", 5, area.fd(0), bytes));
  }
  StateLinkClient c("localhost", server.port(), "the round's key");
  const auto images = c.get(5, 1 << 20);
  REQUIRE(images.size() == 2);
  CHECK(images[0].gen == 2);
  CHECK(images[0].step == 20);
  CHECK(images[1].gen == 3);
  CHECK(images[1].bytes == kPageBytes + 1064);
  CHECK(images[1].data[kPageBytes] == 3);
  CHECK(images[1].data[kPageBytes + 1063] == 3);
  CHECK(StateLinkClient("127.0.0.1", server.port(), "the round's key").get(6, 1 << 20).empty());
  // An image larger than the asker's slot is refused before it is read (a peer cannot make it allocate).
  CHECK_THROWS_WITH(StateLinkClient("127.0.0.1", server.port(), "the round's key").get(5, kPageBytes + 1000),
                    Catch::Contains("over this node's slot"));
  CHECK(server.ranks() == std::vector<int>{5});
}

TEST_CASE("state link: a published address splits at its last colon, its port 1 to 65535, anything else refused", "[state]") {
  using P = std::pair<std::string, std::uint16_t>;
  CHECK(StateLinkClient::split_address("h1:29500") == P{"h1", 29500});
  CHECK(StateLinkClient::split_address("::1:1") == P{"::1", 1});  // an IPv6 literal keeps its colons
  CHECK(StateLinkClient::split_address("10.0.0.2:65535") == P{"10.0.0.2", 65535});
  for (const char* bad : {"h1", "h1:", ":29500", "h1:0", "h1:65536", "h1:99999999999999999999", "h1:-1", "h1:12x",
                          "h1: 80"}) {
    CHECK_THROWS_WITH(StateLinkClient::split_address(bad), Catch::Contains("malformed state copy address"));
  }
}

TEST_CASE("state link: a client without the round's key is refused, and a server without it is not trusted", "[state]") {
  StateAreas area(1, 4 << 20);
  StateLinkServer server(1 << 20);
  server.start();
  server.set_key("round 3");
  const auto bytes = save(area.fd(0), 1, 1, 1);
  CHECK_THROWS_WITH(put(server, "round 2", 0, area.fd(0), bytes), Catch::Contains("copy key"));
  CHECK(server.ranks().empty());
  server.set_key("");  // no round yet: nobody gets in
  CHECK_THROWS_WITH(put(server, "", 0, area.fd(0), bytes), Catch::Contains("copy key"));
}

TEST_CASE("state link: an image the sender found written over, a malformed one, or one over the budget is not kept",
          "[state]") {
  StateAreas area(1, 4 << 20);
  StateLinkServer server(2 * kPageBytes + 1064);
  server.start();
  server.set_key("k");
  auto bytes = save(area.fd(0), 1, 1, 1);
  CHECK_FALSE(put(server, "k", 0, area.fd(0), bytes, false));
  CHECK(server.ranks().empty());
  CHECK_FALSE(put(server, "k", 0, area.fd(0), bytes - 1));  // its payload is not all there
  CHECK(put(server, "k", 0, area.fd(0), bytes));
  bytes = save(area.fd(0), 2, 2, 2);
  CHECK_FALSE(put(server, "k", 1, area.fd(0), bytes));  // two images do not fit
  CHECK(put(server, "k", 0, area.fd(0), bytes));        // the rank's older one makes room
  CHECK(server.images(0).size() == 1);
  CHECK(server.images(0)[0].gen == 2);
  CHECK(server.held_bytes() == kPageBytes + 1064);
  server.drop_before(1);
  CHECK(server.ranks().empty());
}

TEST_CASE("state link: clients that dribble their handshake, more than the server serves, hold it 2 s at most",
          "[state]") {
  using namespace std::chrono_literals;
  StateAreas area(1, 4 << 20);
  StateLinkServer server(1 << 20);
  server.start();
  server.set_key("k");
  const auto bytes = save(area.fd(0), 1, 1, 1);
  // 12 connections (the server serves 8 at once), each sending its handshake a byte each 200 ms:
  // every read gets a byte well within 2 s, the handshake's 68 bytes would take 14 s.
  std::vector<int> fds;
  for (int i = 0; i < 12; ++i) fds.push_back(connect_to(server.port()));
  std::atomic<bool> stop{false};
  std::thread dribbler([&] {
    for (int t = 0; t < 100 && !stop; ++t) {
      for (int fd : fds) (void)!::send(fd, t < 4 ? "DDPS" + t : "x", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(200ms);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  bool kept = false;
  int refused = 0;
  while (!kept && std::chrono::steady_clock::now() - t0 < 15s) {
    try {
      kept = put(server, "k", 0, area.fd(0), bytes);
    } catch (const ddprun::Error&) {  // no place yet: the server closed the connection
      ++refused;
      std::this_thread::sleep_for(100ms);
    }
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  stop = true;
  dribbler.join();
  for (int fd : fds) ::close(fd);
  INFO("the put was kept after " << took.count() << " s, " << refused << " tries refused");
  CHECK(kept);
  CHECK(refused > 0);  // the dribblers did hold every place first
  CHECK(took.count() < 5.0);
}
