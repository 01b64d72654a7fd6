// NCCL without a GPU: the unique id exchange through the store works on any machine
// (ncclGetUniqueId needs no device). GPU tests live in gpu_tests (skipped without a GPU).

#include <catch2/catch.hpp>

#include "skip.hpp"
#include <set>

#include "ddprun/common/error.hpp"
#include "group_fixture.hpp"
#include "nccl_unique_id.hpp"

using namespace ddprun;

TEST_CASE("nccl: rank 0's unique id reaches every rank through the store", "[nccl]") {
  test::Ranks ranks;
  std::vector<std::string> ids(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] { ids[r] = runtime::exchange_nccl_unique_id(*ranks.store("attempt_0/nccl"), r); });
  }
  for (auto& t : threads) t.join();
  CHECK(ids[0].size() == 128);
  CHECK(std::set<std::string>(ids.begin(), ids.end()).size() == 1);
  CHECK(ids[0] != std::string(128, '\0'));
  // A new attempt gets a new id under its own prefix.
  std::string next = runtime::exchange_nccl_unique_id(*ranks.store("attempt_1/nccl"), 0);
  CHECK(next != ids[0]);
}

TEST_CASE("nccl: a rank waiting for an id nobody publishes times out, naming the key", "[nccl]") {
  test::Ranks ranks;
  auto store = ranks.store("lonely/nccl");
  store->set_timeout(std::chrono::milliseconds(300));
  CHECK_THROWS_WITH(runtime::exchange_nccl_unique_id(*store, 1), Catch::Contains("unique_id"));
}

TEST_CASE("nccl: without a usable GPU the backend says so", "[nccl]") {
  test::Ranks ranks;
  try {
    runtime::create_process_group("nccl", ranks.store("nogpu"), 0, 1);
    // (a GPU is here: the GPU tests, tests/runtime/gpu, are the ones that run; this one is of
    // the machine without)
    SKIP_UNLESS_HARDWARE(false, "a GPU is present: this test is of the nccl backend on a machine without one");
  } catch (const ddprun::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("no CUDA device"));
  }
}
