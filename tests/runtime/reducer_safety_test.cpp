// The Reducer's safety nets: rank 0's parameters everywhere at construction, parameter lists
// compared across ranks, a missing finalize() named, gradients in memory the program owns.

#include <catch2/catch.hpp>
#include <memory>
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

// A trainer that forgets finalize() reads its gradients through grad(i) for the optimizer step:
// that read is refused, naming finalize(), so no parameter ever moves by an unaveraged gradient.
TEST_CASE("a trainer skipping finalize() is stopped, naming finalize(), before it applies any gradient", "[reducer]") {
  test::Ranks ranks;
  ranks.run(2, [](int r, ProcessGroup& pg) {
    for (bool own_memory : {false, true}) {
      std::vector<float> w(64, 1.0f), b(3, 1.0f), grads(67);
      std::vector<ParameterSpec> specs = {{w.size(), DataType::kFloat32, w.data()},
                                          {b.size(), DataType::kFloat32, b.data()}};
      auto red = own_memory ? std::make_unique<Reducer>(borrow(pg), specs, grads.data())
                            : std::make_unique<Reducer>(borrow(pg), specs);
      auto sgd = [&](std::vector<float>& p, std::size_t i) {
        const float* g = red->grad_as<float>(i);
        for (std::size_t k = 0; k < p.size(); ++k) p[k] -= 0.5f * g[k];
      };
      red->zero_grad();
      std::fill_n(red->grad_as<float>(1), 3, static_cast<float>(2 * r + 2));
      red->mark_ready(1);
      std::fill_n(red->grad_as<float>(0), 64, static_cast<float>(2 * r + 2));  // not ready yet: writable
      red->mark_ready(0);
      // (finalize() forgotten)
      RANK_CHECK_THROWS_WITH(sgd(w, 0), "grad(0) after mark_ready(0) and before finalize()");
      RANK_CHECK_THROWS_WITH(sgd(b, 1), "call finalize()");
      RANK_CHECK_THROWS_WITH(red->zero_grad(), "call finalize()");
      RANK_CHECK(w == std::vector<float>(64, 1.0f));  // no parameter moved
      RANK_CHECK(b == std::vector<float>(3, 1.0f));
      red->finalize();
      sgd(w, 0);
      sgd(b, 1);
      RANK_CHECK(w[63] == -0.5f);  // 1 - 0.5 * (2 + 4) / 2
      RANK_CHECK(b[0] == -0.5f);
      // An iteration cut short (one of two parameters marked, no bucket on the wire yet) is
      // pending as well: zero_grad() names finalize() instead of wiping it.
      red->zero_grad();
      red->mark_ready(0);
      RANK_CHECK_THROWS_WITH(red->zero_grad(), "call finalize()");
      red->mark_ready(1);
      red->finalize();
    }
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
