// StateCopies (workers/state_copies.hpp) between rounds: the thread of the copies, at rest, is
// not what a restart waits for.
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "workers/state_areas.hpp"
#include "workers/state_copies.hpp"

using namespace ddprun::agent;
using namespace std::chrono_literals;

namespace {

// A round of two nodes in which no member holds state: settling it touches no store (none
// listens at the address given).
ddprun::rounds::RoundInfo round_of_two(int round) {
  ddprun::rounds::RoundInfo info;
  info.round = round;
  info.group_world = 2;
  info.world_size = 2;
  info.rank_offset = round % 2;  // (the rank moves: an area kept aside and emptied, as a newcomer's)
  info.group_rank = round % 2;
  info.store_host = "127.0.0.1";
  info.store_port = 1;
  info.next_state_link = "127.0.0.1:1";
  return info;
}

}  // namespace

TEST_CASE("state copies: a new round is settled at once, however long the copies have rested", "[state]") {
  StateAreas areas(1, 1 << 20);
  StateCopies copies(areas, "127.0.0.1", 1ull << 30, 2ull << 20, "", "job");
  const auto offer = copies.offer();
  CHECK(!offer.holds);  // nothing saved yet
  CHECK(offer.link.rfind("127.0.0.1:", 0) == 0);
  std::mutex mu;
  std::condition_variable cv;
  int ready = -1;
  auto prepare = [&](int round) {
    copies.prepare(round_of_two(round), [&, round] {
      std::lock_guard<std::mutex> lk(mu);
      ready = round;
      cv.notify_all();
    });
  };
  auto wait_ready = [&](int round) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, 10s, [&] { return ready == round; });
  };
  prepare(0);
  REQUIRE(wait_ready(0));
  // At rest the copies look for a save less and less often (up to once a second while the node
  // has seen no state): 2.5 s in, a look is most of a second away.
  std::this_thread::sleep_for(2500ms);
  const auto t0 = std::chrono::steady_clock::now();
  copies.stop_sending();  // the round ended
  prepare(1);
  REQUIRE(wait_ready(1));
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO("the next round was ready after " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < 300ms);  // 0.2 ms here; 0.5-0.8 s when the pause was a plain sleep
}
