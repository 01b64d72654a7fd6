// Subgroups (split, new_group) on gloo (real, ranks as threads) and on the nccl backend over the
// fake NCCL/CUDA: a 2D data x tensor parallel layout, rank order by key, ranks left out, time-outs,
// a unique id per NCCL group, and gradient compression on the nccl backend.

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/store.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "fake_ranks.hpp"

using namespace ddprun;
using namespace ddprun::runtime;
using namespace std::chrono_literals;
using ddprun::test::message_of;

namespace {

// What one rank of a 4-rank world (2 data parallel x 2 tensor parallel) saw.
struct Seen {
  int tp_rank = -1, tp_size = -1, dp_rank = -1, dp_size = -1, reversed_rank = -1, odd_rank = -1, odd_size = 0;
  float tp_sum = -1, dp_sum = -1, world_sum = -1, odd_sum = -1;
  std::string error;
};

// The sum over `g` of one float, through the group's memory (device memory on nccl).
float sum_of(ProcessGroup& g, float v) {
  void* d = g.allocate(sizeof(float));
  g.copy_to_device(d, &v, sizeof v);
  g.all_reduce(d, 1, DataType::kFloat32, ReduceOp::kSum);
  float out = -1;
  g.copy_to_host(&out, d, sizeof out);
  g.deallocate(d);
  return out;
}

// Rank r = dp * 2 + tp: tensor parallel groups {0,1} {2,3}, data parallel groups {0,2} {1,3}.
void two_d(int r, ProcessGroup& world, Seen& s) {
  const int tp = 2;
  auto tp_group = world.split(r / tp, r % tp);
  auto dp_group = world.split(r % tp, r / tp);
  auto reversed = world.split(0, -r);      // one group, ordered by key: rank 3 first
  auto odd = world.new_group({3, 1});      // ranks 0 and 2 get none
  s.tp_rank = tp_group->rank();
  s.tp_size = tp_group->size();
  s.dp_rank = dp_group->rank();
  s.dp_size = dp_group->size();
  s.reversed_rank = reversed->rank();
  const float mine = static_cast<float>(r + 1);
  s.tp_sum = sum_of(*tp_group, mine);  // interleaved: each group keeps its own order
  s.world_sum = sum_of(world, mine);
  s.dp_sum = sum_of(*dp_group, mine);
  if (odd) {
    s.odd_rank = odd->rank();
    s.odd_size = odd->size();
    s.odd_sum = sum_of(*odd, mine);
  }
}

void check_two_d(const std::vector<Seen>& seen) {
  for (int r = 0; r < 4; ++r) {
    const Seen& s = seen[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << s.error);
    CHECK(s.error.empty());
    CHECK(s.tp_rank == r % 2);
    CHECK(s.tp_size == 2);
    CHECK(s.dp_rank == r / 2);
    CHECK(s.dp_size == 2);
    CHECK(s.reversed_rank == 3 - r);
    CHECK(s.tp_sum == (r < 2 ? 1.0f + 2.0f : 3.0f + 4.0f));
    CHECK(s.dp_sum == (r % 2 == 0 ? 1.0f + 3.0f : 2.0f + 4.0f));
    CHECK(s.world_sum == 10.0f);
    CHECK(s.odd_size == (r % 2 == 1 ? 2 : 0));
    CHECK(s.odd_rank == (r == 1 ? 0 : r == 3 ? 1 : -1));
    CHECK(s.odd_sum == (r % 2 == 1 ? 6.0f : -1.0f));
  }
}

}  // namespace

TEST_CASE("groups: 2D data x tensor parallel on gloo", "[groups]") {
  test::Ranks ranks;
  std::vector<Seen> seen(4);
  ranks.run(4, [&](int r, ProcessGroup& world) {
    auto& s = seen[static_cast<std::size_t>(r)];
    s.error = message_of([&] { two_d(r, world, s); });
  });
  check_two_d(seen);
}

TEST_CASE("groups: 2D data x tensor parallel on nccl (fake NCCL: ncclCommSplit)", "[groups][nccl-fake]") {
  test::FakeRanks f(4);
  std::vector<Seen> seen(4);
  auto errors = f.run([&](int r, ProcessGroup& world) {
    auto& s = seen[static_cast<std::size_t>(r)];
    s.error = message_of([&] { two_d(r, world, s); });
  });
  CHECK(errors == std::vector<std::string>(4));
  check_two_d(seen);
  for (auto& st : f.states) {
    CHECK(st->splits == 4);  // every rank took part in every split, new_group's left-out ranks too
    CHECK(st->inits == 1);   // subgroups come from ncclCommSplit, not from new unique ids
    CHECK(st->wrong_device().empty());
  }
}

TEST_CASE("groups: bad new_group lists, and a rank that never splits, are clear errors", "[groups]") {
  test::Ranks ranks;
  ProcessGroupOptions opt;
  opt.timeout = 300ms;
  std::vector<std::string> errors(2);
  ranks.run(2, [&](int r, ProcessGroup& world) {
    if (r == 1) {
      errors[1] = message_of([&] { world.new_group({0, 2}); }) + " | " + message_of([&] { world.new_group({1, 1}); }) +
                  " | " + message_of([&] { world.new_group({}); });
      return;  // rank 1 never calls split
    }
    errors[0] = message_of([&] { world.split(0, 0); });
  }, opt);
  CHECK_THAT(errors[1], Catch::Contains("rank 2 is not a rank of a group of 2") && Catch::Contains("listed twice") &&
                            Catch::Contains("empty"));
  CHECK_THAT(errors[0], Catch::Contains("split_1/rank_1"));
}

TEST_CASE("groups: each NCCL group gets its own unique id (fake NCCL)", "[groups][nccl-fake]") {
  test::FakeRanks f(2);
  float sums[2][2] = {{-1, -1}, {-1, -1}};
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      errors[static_cast<std::size_t>(r)] = message_of([&] {
        auto a = f.group(r);
        auto b = f.group(r);  // a second group of the same attempt, on the same store
        sums[r][0] = sum_of(*a, 1.0f);
        sums[r][1] = sum_of(*b, 2.0f);
      });
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(sums[0][0] == 2.0f);
  CHECK(sums[1][1] == 4.0f);
  auto store = f.ranks.store("fake");
  auto ids = store->multi_get({"group_1/unique_id", "group_2/unique_id"});
  CHECK(ids[0].size() == 128);
  CHECK(ids[1].size() == 128);
  CHECK(ids[0] != ids[1]);
}

TEST_CASE("compression on nccl: float32 buckets travel as 16 bits, cast on the group's stream (fake NCCL)",
          "[reducer][nccl-fake]") {
  for (auto c : {Compression::kFloat16, Compression::kBFloat16}) {
    test::FakeRanks f(2);
    const std::size_t n = 10000;
    double max_err[2] = {-1, -1}, max_abs[2] = {0, 0};
    auto errors = f.run([&](int r, ProcessGroup& g) {
      auto shared = std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {});
      ReducerOptions opt;
      opt.compression = c;
      opt.broadcast_parameters = false;
      Reducer red(shared, {{n}}, opt);
      std::vector<std::vector<float>> grads(2, std::vector<float>(n));
      for (int k = 0; k < 2; ++k) {
        std::mt19937 gen(42 + static_cast<unsigned>(k));
        std::normal_distribution<float> d(0.0f, 1e-2f);
        for (auto& v : grads[static_cast<std::size_t>(k)]) v = d(gen);
      }
      g.copy_to_device(red.grad(0), grads[static_cast<std::size_t>(r)].data(), n * sizeof(float));
      red.mark_ready(0);
      red.finalize();
      std::vector<float> out(n);
      g.copy_to_host(out.data(), red.grad(0), n * sizeof(float));
      for (std::size_t i = 0; i < n; ++i) {
        double exact = (static_cast<double>(grads[0][i]) + grads[1][i]) / 2;
        max_abs[r] = std::max(max_abs[r], std::abs(exact));
        max_err[r] = std::max(max_err[r], std::abs(out[i] - exact));
      }
    });
    CHECK(errors == std::vector<std::string>{"", ""});
    double bound = c == Compression::kFloat16 ? 1e-3 : 8e-3;  // relative, of the largest average
    for (int r = 0; r < 2; ++r) {
      CHECK(max_err[r] <= bound * max_abs[r] * 2);
      CHECK(max_err[r] > 0);  // it really went through 16 bits
      CHECK(f.states[static_cast<std::size_t>(r)]->casts == 2);  // to 16 bits and back, on the device
    }
  }
}
