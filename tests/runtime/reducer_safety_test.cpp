// The Reducer's safety nets: rank 0's parameters everywhere at construction, parameter lists
// compared across ranks, a missing finalize() named, gradients in memory the program owns.

#include <catch2/catch.hpp>
#include <numeric>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "group_fixture.hpp"

using namespace ddprun;
using namespace ddprun::runtime;

namespace {
std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}); }
}  // namespace

TEST_CASE("the Reducer broadcasts rank 0's parameters at construction, and none without data unless told", "[reducer]") {
  test::Ranks ranks;
  ranks.run(3, [](int r, ProcessGroup& pg) {
    std::vector<float> w(300, static_cast<float>(r + 1)), b(7, static_cast<float>(10 * r));
    Reducer red(borrow(pg), {{w.size(), DataType::kFloat32, w.data()}, {b.size(), DataType::kFloat32, b.data()}});
    RANK_CHECK(w[299] == 1.0f);
    RANK_CHECK(b[0] == 0.0f);
    RANK_CHECK_THROWS_WITH(Reducer(borrow(pg), {{10}}), "parameter 0 has no data");
    std::vector<float> mine(5, static_cast<float>(r));
    ReducerOptions off;
    off.broadcast_parameters = false;
    Reducer untouched(borrow(pg), {{mine.size(), DataType::kFloat32, mine.data()}}, off);
    RANK_CHECK(mine[4] == static_cast<float>(r));
  });
}

TEST_CASE("the Reducer names ranks that registered different parameters, on every rank", "[reducer]") {
  test::Ranks ranks;
  ranks.run(2, [](int r, ProcessGroup& pg) {
    ReducerOptions off;
    off.broadcast_parameters = false;
    std::vector<ParameterSpec> params = {{16}, {r == 1 ? std::size_t{8} : std::size_t{4}}};
    RANK_CHECK_THROWS_WITH(Reducer(borrow(pg), params, off),
                           "the ranks registered different parameters (rank 0: 2 parameters of 20 "
                                           "elements; rank 1: 2 parameters of 24 elements)");
  });
}

TEST_CASE("a missing finalize() is named at the next iteration, before its gradients are touched", "[reducer]") {
  test::Ranks ranks;
  ranks.run(2, [](int, ProcessGroup& pg) {
    ReducerOptions off;
    off.broadcast_parameters = false;
    {
      Reducer red(borrow(pg), {{64}, {64}}, off);
      red.mark_ready(1);
      red.mark_ready(0);
      RANK_CHECK_THROWS_WITH(red.zero_grad(), "call finalize()");
      red.finalize();
    }
    Reducer red(borrow(pg), {{64}}, off);
    red.mark_ready(0);
    RANK_CHECK_THROWS_WITH(red.mark_ready(0), "the last iteration was never finalized: call finalize()");
    red.finalize();
    red.zero_grad();  // finalized: fine
  });
}

TEST_CASE("the Reducer reduces in place in one gradient array the program owns (llm.c style)", "[reducer]") {
  test::Ranks ranks;
  ranks.run(3, [](int r, ProcessGroup& pg) {
    std::vector<ParameterSpec> params = {{1000}, {37}, {4096}, {3}};
    const std::size_t total = 1000 + 37 + 4096 + 3;
    std::vector<float> grads(total);
    ReducerOptions o;
    o.broadcast_parameters = false;
    o.first_bucket_bytes = 64;
    o.bucket_cap_bytes = 8192;  // several buckets over the one array
    Reducer red(borrow(pg), params, grads.data(), o);
    RANK_CHECK(red.buckets().size() > 1);
    RANK_CHECK(red.grad_as<float>(0) == grads.data());
    RANK_CHECK(red.grad_as<float>(2) == grads.data() + 1037);
    for (int step = 0; step < 2; ++step) {
      red.zero_grad();
      for (std::size_t i = 0; i < total; ++i) grads[i] += static_cast<float>((r + 1) * (i % 13) + step);
      for (std::size_t k = params.size(); k-- > 0;) red.mark_ready(k);
      red.finalize();
      bool right = true;
      for (std::size_t i = 0; i < total; ++i) right = right && grads[i] == static_cast<float>(2 * (i % 13) + step);
      RANK_CHECK(right);
    }
  });
}
