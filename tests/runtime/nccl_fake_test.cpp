// The nccl backend's failure guarantees on the fake NCCL/CUDA (tests/fakes), so they run in
// CI on machines without a GPU: a peer dying during the last bucket, a time-out, an
// asynchronous NCCL error, a call stuck inside NCCL, an error while enqueueing, failures at
// creation and teardown, and a second wait() after each. The real-device tests are gpu_tests.

#include <catch2/catch.hpp>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "fake_ranks.hpp"

using namespace ddprun;
using namespace ddprun::runtime;
using namespace std::chrono_literals;
using ddprun::test::message_of;
using nccl::fake::Fate;

namespace {

using Clock = std::chrono::steady_clock;

ProcessGroupOptions with_timeout(std::chrono::milliseconds t) {
  ProcessGroupOptions o;
  o.timeout = t;
  return o;
}

// A Reducer with three parameters, one bucket each (1 KiB buckets).
std::unique_ptr<Reducer> three_buckets(std::shared_ptr<ProcessGroup> g) {
  ReducerOptions o;
  o.first_bucket_bytes = 1024;
  o.bucket_cap_bytes = 1024;
  o.broadcast_parameters = false;
  return std::make_unique<Reducer>(std::move(g), std::vector<ParameterSpec>{{256}, {256}, {256}}, o);
}

void backward(Reducer& r) {
  for (std::size_t i = 3; i-- > 0;) r.mark_ready(i);
}

}  // namespace

TEST_CASE("fake nccl: a healthy step and a clean teardown", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  {
    auto g = f.group(0);
    auto r = three_buckets(g);
    REQUIRE(r->buckets().size() == 3);
    backward(*r);
    r->finalize();
    g->barrier();
  }
  CHECK(s.collectives == 4);
  CHECK(s.destroys == 1);
  CHECK(s.aborts == 0);
  CHECK(s.events_created == s.events_destroyed);
  CHECK(s.mallocs == s.frees);
  CHECK(s.wrong_device().empty());
}

TEST_CASE("fake nccl: a peer dying during the last bucket fails the step - never a silent success", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  s.fates[2] = Fate::kPeerDies;  // buckets are collectives 0, 1, 2: the last one
  auto g = f.group(0);
  auto r = three_buckets(g);
  backward(*r);
  // finalize() does not wait for the device: it throws if the watchdog has seen the error by
  // then, and the next call that waits for the device (here barrier) throws if not.
  std::string first = message_of([&] { r->finalize(); });
  std::string next = message_of([&] { g->barrier(); });
  INFO(first << " / " << next);
  CHECK((first.empty() || Catch::contains(first, "remote process exited")));
  CHECK_THAT(next, Catch::Contains("remote process exited") && Catch::Contains("all_reduce"));
  CHECK(s.aborts == 1);
  // Every later call fails at once, naming the first cause.
  auto t0 = Clock::now();
  std::string later = message_of([&] { g->barrier(); });
  CHECK(Clock::now() - t0 < 100ms);
  CHECK_THAT(later, Catch::Contains("failed earlier") && Catch::Contains("remote process exited"));
  CHECK_THAT(message_of([&] { backward(*r); }), Catch::Contains("failed earlier"));  // the next step
  CHECK_THROWS(r->finalize());
}

TEST_CASE("fake nccl: wait() does not block the host, and every wait after a failure rethrows it", "[nccl-fake]") {
  for (Fate fate : {Fate::kPeerDies, Fate::kHang}) {
    test::FakeRanks f(1);
    f.states[0]->fates[0] = fate;
    auto g = f.group(0, with_timeout(1s));
    void* buf = g->allocate(16);
    auto work = g->all_reduce_async(buf, 4, DataType::kFloat32, ReduceOp::kSum);
    auto t0 = Clock::now();
    std::string pending = message_of([&] { work->wait(); });  // stream order only
    auto waited = Clock::now() - t0;
    std::string a = message_of([&] { work->synchronize(); });
    std::string b = message_of([&] { work->wait(); });
    std::string c = message_of([&] { work->synchronize(); });
    INFO(pending << " / " << a);
    CHECK(waited < 500ms);  // a wait() blocking the host would last the time-out (1 s)
    CHECK(!a.empty());
    CHECK(a == b);
    CHECK(b == c);
    if (fate == Fate::kHang) {
      CHECK(pending.empty());
      CHECK_THAT(a, Catch::Contains("all_reduce on rank 0 of 1 timed out after 1 s"));
      CHECK_THROWS_AS(work->wait(), ddprun::TimeoutError);
    } else {
      CHECK_THAT(a, Catch::Contains("remote process exited"));
      CHECK_THROWS_AS(work->wait(), ddprun::NetworkError);
    }
    g->deallocate(buf);
  }
}

TEST_CASE("fake nccl: a time-out aborts the communicator - pending work fails too", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  s.fates[0] = Fate::kHang;
  s.fates[1] = Fate::kHang;
  auto g = f.group(0, with_timeout(100ms));
  void* a = g->allocate(16);
  void* b = g->allocate(16);
  auto w0 = g->all_reduce_async(a, 4, DataType::kFloat32, ReduceOp::kSum);
  auto w1 = g->all_reduce_async(b, 4, DataType::kFloat32, ReduceOp::kSum, 60s);
  auto t0 = Clock::now();
  CHECK_THROWS_AS(w0->synchronize(), ddprun::TimeoutError);
  auto took = Clock::now() - t0;
  CHECK(took >= 100ms);
  CHECK(took < 2s);
  CHECK(s.aborts == 1);
  // w1 can never complete after the abort: it fails at once, with the cause.
  t0 = Clock::now();
  CHECK_THAT(message_of([&] { w1->synchronize(); }), Catch::Contains("failed earlier") && Catch::Contains("timed out"));
  CHECK_THROWS_AS(w1->wait(), ddprun::TimeoutError);
  CHECK(Clock::now() - t0 < 50ms);
}

TEST_CASE("fake nccl: a call stuck inside NCCL is timed out by the watchdog", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  s.fates[0] = Fate::kCallHangs;  // NCCL connecting to a dead peer on first use
  auto g = f.group(0, with_timeout(200ms));
  void* buf = g->allocate(16);
  auto t0 = Clock::now();
  std::string msg = message_of([&] { g->all_reduce(buf, 4, DataType::kFloat32, ReduceOp::kSum); });
  auto took = Clock::now() - t0;
  CHECK_THAT(msg, Catch::Contains("timed out after 200 ms inside NCCL"));
  CHECK(took >= 200ms);
  CHECK(took < 900ms);  // no grace period for the call the abort is meant to end
  CHECK(s.aborts == 1);
  CHECK_THROWS_AS(g->barrier(), ddprun::TimeoutError);
}

TEST_CASE("fake nccl: an error while enqueueing leaks no event and breaks the group", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  s.fates[1] = Fate::kEnqueueError;
  {
    auto g = f.group(0);
    auto r = three_buckets(g);
    CHECK_THROWS_WITH(backward(*r), Catch::Contains("unhandled cuda error") && Catch::Contains("ncclAllReduce"));
    CHECK_THROWS(r->finalize());  // the step cannot complete
  }
  CHECK(s.events_created == s.events_destroyed);
  CHECK(s.aborts == 1);
  CHECK(s.destroys == 0);
  CHECK(s.mallocs == s.frees);
}

TEST_CASE("fake nccl: teardown destroys a whole group within its time-out and aborts a broken one", "[nccl-fake]") {
  SECTION("ncclCommDestroy hangs: left to finish, the destructor returns") {
    test::FakeRanks f(1);
    f.states[0]->destroy_hangs = true;
    auto t0 = Clock::now();
    { auto g = f.group(0, with_timeout(150ms)); }
    auto took = Clock::now() - t0;
    CHECK(took >= 150ms);
    CHECK(took < 3s);
    CHECK(f.states[0]->destroys == 1);
    CHECK(f.states[0]->aborts == 0);
  }
  SECTION("a broken group is aborted, not destroyed") {
    test::FakeRanks f(1);
    f.states[0]->fates[0] = Fate::kPeerDies;
    {
      auto g = f.group(0);
      CHECK_THROWS(g->barrier());
    }
    CHECK(f.states[0]->destroys == 0);
    CHECK(f.states[0]->aborts == 1);
    CHECK(f.states[0]->mallocs == f.states[0]->frees);
  }
}

TEST_CASE("fake nccl: a peer that never creates the group times out communicator init", "[nccl-fake]") {
  test::FakeRanks f(2);
  auto t0 = Clock::now();
  std::string msg = message_of([&] { f.group(0, with_timeout(300ms)); });  // rank 1 never comes
  auto took = Clock::now() - t0;
  CHECK_THAT(msg, Catch::Contains("communicator initialisation on rank 0 of 2 timed out after 300 ms"));
  CHECK(took < 2s);
}
