// The nccl backend's state machine on a fake NCCL/CUDA (nccl_api.hpp), so its failure paths run
// in CI on machines without a GPU: a peer dying during the last bucket, a time-out, an
// asynchronous NCCL error, an error while enqueueing, a failure during teardown, and a second
// wait() after each. The real-device tests stay in gpu_tests (label gpu).

#include <catch2/catch.hpp>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "group_fixture.hpp"
#include "fake_nccl.hpp"

using namespace ddprun;
using namespace ddprun::runtime;
using ddprun::test::message_of;
using nccl::Status;
using nccl::fake::Fate;

namespace {

struct Fixture {
  test::Ranks ranks;
  std::shared_ptr<nccl::fake::State> state = std::make_shared<nccl::fake::State>();
  std::shared_ptr<ProcessGroup> group(std::chrono::milliseconds timeout = std::chrono::milliseconds(300)) {
    ProcessGroupOptions o;
    o.timeout = timeout;
    static int n = 0;
    return nccl::make_process_group(nccl::fake::make_api(state), ranks.store("fake" + std::to_string(n++)), 0, 1,
                                     o, 0);
  }
};

// A Reducer with three parameters, one bucket each (1 KiB buckets).
std::unique_ptr<Reducer> three_buckets(std::shared_ptr<ProcessGroup> g) {
  ReducerOptions o;
  o.first_bucket_bytes = 1024;
  o.bucket_cap_bytes = 1024;
  auto r = std::make_unique<Reducer>(std::move(g), std::vector<ParameterSpec>{{256}, {256}, {256}}, o);
  REQUIRE(r->buckets().size() == 3);
  return r;
}

void backward(Reducer& r) {
  for (std::size_t i = 3; i-- > 0;) r.mark_ready(i);
}

}  // namespace

TEST_CASE("fake nccl: a healthy step and a clean teardown (finalize polled, then destroy)", "[nccl-fake]") {
  Fixture f;
  f.state->finalize_polls_in_progress = 5;
  {
    auto g = f.group();
    auto r = three_buckets(g);
    backward(*r);
    r->finalize();
    g->barrier();
  }
  CHECK(f.state->finalizes == 1);
  CHECK(f.state->destroys == 1);
  CHECK(f.state->aborts == 0);
  CHECK(f.state->live_events.empty());
  CHECK(f.state->mallocs == f.state->frees);
}

TEST_CASE("fake nccl: a peer dying during the last bucket fails finalize - never a silent success", "[nccl-fake]") {
  Fixture f;
  f.state->fates[2] = Fate::kPeerDies;  // buckets are collectives 0, 1, 2: the last one
  auto g = f.group();
  auto r = three_buckets(g);
  backward(*r);
  std::string first = message_of([&] { r->finalize(); });
  CHECK_THAT(first, Catch::Contains("remote process exited") && Catch::Contains("all_reduce"));
  CHECK(f.state->aborts == 1);
  // Every later call fails at once, naming the first cause.
  auto t0 = std::chrono::steady_clock::now();
  std::string later = message_of([&] { g->barrier(); });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  CHECK_THAT(later, Catch::Contains("failed earlier") && Catch::Contains("remote process exited"));
  CHECK_THAT(message_of([&] { backward(*r); }), Catch::Contains("failed earlier"));  // the next step
  CHECK_THROWS(r->finalize());
}

TEST_CASE("fake nccl: every wait() after a failure rethrows it", "[nccl-fake]") {
  for (Fate fate : {Fate::kPeerDies, Fate::kHang}) {
    Fixture f;
    f.state->fates[0] = fate;
    auto g = f.group(std::chrono::milliseconds(100));
    std::vector<float> buf(4);
    auto work = g->all_reduce_async(buf.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    std::string a = message_of([&] { work->wait(); });
    std::string b = message_of([&] { work->wait(); });
    std::string c = message_of([&] { work->wait(); });
    INFO(a);
    CHECK(!a.empty());
    CHECK(a == b);
    CHECK(b == c);
    if (fate == Fate::kHang) {
      CHECK_THAT(a, Catch::Contains("timed out after 100 ms"));
      CHECK_THROWS_AS(work->wait(), ddprun::TimeoutError);
    } else {
      CHECK_THROWS_AS(work->wait(), ddprun::NetworkError);
    }
  }
}

TEST_CASE("fake nccl: a time-out aborts the communicator - pending work fails too", "[nccl-fake]") {
  Fixture f;
  f.state->fates[0] = Fate::kHang;
  f.state->fates[1] = Fate::kHang;
  auto g = f.group(std::chrono::milliseconds(100));
  std::vector<float> a(4), b(4);
  auto w0 = g->all_reduce_async(a.data(), 4, DataType::kFloat32, ReduceOp::kSum);
  auto w1 = g->all_reduce_async(b.data(), 4, DataType::kFloat32, ReduceOp::kSum);
  CHECK_THROWS_AS(w0->wait(), ddprun::TimeoutError);
  CHECK(f.state->aborts == 1);
  // w1 can never complete after the abort: it fails at once with the cause.
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THAT(message_of([&] { w1->wait(); }), Catch::Contains("failed earlier") && Catch::Contains("timed out"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50));
}

TEST_CASE("fake nccl: an error while enqueueing leaks no event and breaks the group", "[nccl-fake]") {
  Fixture f;
  f.state->fates[1] = Fate::kEnqueueError;
  {
    auto g = f.group();
    auto r = three_buckets(g);
    CHECK_THROWS_WITH(backward(*r), Catch::Contains("unhandled cuda error"));
    CHECK_THROWS(r->finalize());  // the step cannot complete
  }
  CHECK(f.state->live_events.empty());
  CHECK(f.state->events_created == f.state->events_destroyed);
  CHECK(f.state->aborts == 1);
  CHECK(f.state->destroys == 0);
}

TEST_CASE("fake nccl: teardown aborts when finalize fails or does not complete in time", "[nccl-fake]") {
  SECTION("finalize hangs") {
    Fixture f;
    f.state->finalize_hangs = true;
    auto t0 = std::chrono::steady_clock::now();
    { auto g = f.group(std::chrono::milliseconds(150)); }
    auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took >= std::chrono::milliseconds(150));
    CHECK(took < std::chrono::seconds(3));
    CHECK(f.state->finalizes == 1);
    CHECK(f.state->aborts == 1);
    CHECK(f.state->destroys == 0);
  }
  SECTION("finalize fails") {
    Fixture f;
    f.state->finalize_result = Status::error("internal error");
    { auto g = f.group(); }
    CHECK(f.state->aborts == 1);
    CHECK(f.state->destroys == 0);
  }
  SECTION("a broken group is aborted, not finalized") {
    Fixture f;
    f.state->fates[0] = Fate::kPeerDies;
    {
      auto g = f.group();
      CHECK_THROWS(g->barrier());
    }
    CHECK(f.state->finalizes == 0);
    CHECK(f.state->aborts == 1);
    CHECK(f.state->mallocs == f.state->frees);
  }
}
