// The Reducer against a flat all-reduce of all gradients: bucket caps, registration and ready
// orders, no_sync, unused parameters, compression.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <numeric>
#include <random>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/checkpoint.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "ddprun/runtime/sampler.hpp"
#include "group_fixture.hpp"

using namespace ddprun;
using namespace ddprun::runtime;

namespace {

float grad_value(int rank, std::size_t param, std::size_t i, int micro = 0) {
  return static_cast<float>(((rank + 1) * 31 + static_cast<int>(param) * 7 + static_cast<int>(i % 101) + micro * 5) % 23) -
         11.0f;
}

}  // namespace

TEST_CASE("Reducer equals a flat all-reduce for many bucket caps and ready orders", "[reducer]") {
  test::Ranks ranks;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 12; ++trial) {
    int size = 2 + trial % 3;
    std::size_t nparams = 1 + rng() % 40;
    std::vector<ParameterSpec> params(nparams);
    for (auto& p : params) p.count = 1 + rng() % (trial % 2 ? 300000 : 3000);
    ReducerOptions opt;
    opt.bucket_cap_bytes = std::size_t{1} << (10 + rng() % 14);  // 1 KiB .. 8 MiB
    opt.first_bucket_bytes = std::min(opt.bucket_cap_bytes, std::size_t{1} << (10 + rng() % 10));
    opt.broadcast_parameters = false;  // (values are not what this test checks)
    unsigned seed = rng();
    INFO("trial " << trial << ": " << size << " ranks, " << nparams << " params, cap " << opt.bucket_cap_bytes);
    ranks.run(size, [&](int r, ProcessGroup& pg) {
      auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
      Reducer red(shared, params, opt);
      // Reference: a flat all-reduce of the same gradients.
      std::size_t total = 0;
      for (auto& p : params) total += p.count;
      std::vector<float> flat(total);
      std::size_t off = 0;
      for (std::size_t k = 0; k < nparams; ++k) {
        for (std::size_t i = 0; i < params[k].count; ++i) flat[off + i] = grad_value(r, k, i);
        off += params[k].count;
      }
      pg.all_reduce(flat.data(), total, DataType::kFloat32, ReduceOp::kAvg);
      // Two iterations, each with its own (per-rank) ready order.
      for (int iter = 0; iter < 2; ++iter) {
        red.zero_grad();
        std::vector<std::size_t> order(nparams);
        std::iota(order.begin(), order.end(), 0);
        std::mt19937 g(seed + static_cast<unsigned>(r) * 17 + static_cast<unsigned>(iter));
        std::shuffle(order.begin(), order.end(), g);
        for (auto k : order) {
          float* gp = red.grad_as<float>(k);
          for (std::size_t i = 0; i < params[k].count; ++i) gp[i] = grad_value(r, k, i);
          red.mark_ready(k);
        }
        red.finalize();
        off = 0;
        for (std::size_t k = 0; k < nparams; ++k) {
          const float* gp = red.grad_as<float>(k);
          for (std::size_t i = 0; i < params[k].count; ++i) {
            if (gp[i] != flat[off + i]) RANK_FAIL("param " << k << "[" << i << "] " << gp[i] << " != " << flat[off + i]);
          }
          off += params[k].count;
        }
      }
    });
  }
}

TEST_CASE("buckets: reverse registration order, 1 MiB first, then up to the cap", "[reducer]") {
  test::Ranks ranks;
  ranks.run(1, [](int, ProcessGroup& pg) {
    auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
    // 40 parameters of 256 KiB (65536 floats) each.
    std::vector<ParameterSpec> params(40, ParameterSpec{65536, DataType::kFloat32});
    Reducer red(shared, params, ReducerOptions{.broadcast_parameters = false});
    auto b = red.buckets();
    RANK_CHECK(b.size() == 2);
    RANK_CHECK((b[0].params == std::vector<std::size_t>{39, 38, 37, 36}));  // 1 MiB
    RANK_CHECK(b[0].bytes == 1024 * 1024);
    RANK_CHECK(b[1].params.size() == 36);  // 9 MiB, under 25 MiB
    RANK_CHECK(b[1].params.front() == 35);
    ReducerOptions small;
    small.bucket_cap_bytes = 512 * 1024;
    small.first_bucket_bytes = 256 * 1024;
    small.broadcast_parameters = false;
    Reducer red2(shared, params, small);
    RANK_CHECK(red2.buckets().size() == 1 + 39 / 2 + 1);
    // dtypes are never mixed in one bucket
    Reducer mixed(shared, {{10, DataType::kFloat32}, {10, DataType::kFloat64}, {10, DataType::kFloat32}},
                  ReducerOptions{.broadcast_parameters = false});
    RANK_CHECK(mixed.buckets().size() == 3);
  });
}

TEST_CASE("no_sync accumulates micro-batches and reduces them once", "[reducer]") {
  test::Ranks ranks;
  ranks.run(3, [](int r, ProcessGroup& pg) {
    auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
    std::vector<ParameterSpec> params = {{1000}, {5000}, {17}};
    ReducerOptions opt;
    opt.first_bucket_bytes = 4096;
    opt.bucket_cap_bytes = 8192;
    opt.broadcast_parameters = false;  // (values are not what these tests check)
      Reducer red(shared, params, opt);
    red.zero_grad();
    auto accumulate = [&](int micro) {
      for (std::size_t k = 0; k < params.size(); ++k) {
        float* g = red.grad_as<float>(k);
        for (std::size_t i = 0; i < params[k].count; ++i) g[i] += grad_value(r, k, i, micro);
        red.mark_ready(k);
      }
    };
    {
      auto guard = red.no_sync();
      accumulate(0);
      red.finalize();  // communicates nothing
      accumulate(1);
      red.finalize();
    }
    // Before the synced step, gradients are still local sums: nothing was communicated.
    RANK_CHECK(red.grad_as<float>(0)[5] == grad_value(r, 0, 5, 0) + grad_value(r, 0, 5, 1));
    accumulate(2);
    red.finalize();
    for (std::size_t k = 0; k < params.size(); ++k) {
      for (std::size_t i = 0; i < params[k].count; i += 7) {
        double want = 0;
        for (int q = 0; q < 3; ++q) {
          for (int m = 0; m < 3; ++m) want += grad_value(q, k, i, m);
        }
        RANK_CHECK_MSG(std::abs(red.grad_as<float>(k)[i] - want / 3) <= 1e-4, "param " << k << "[" << i << "]");
      }
    }
  });
}

TEST_CASE("unused parameters contribute zeros with find_unused_parameters, else a clear error", "[reducer]") {
  test::Ranks ranks;
  ranks.run(2, [](int r, ProcessGroup& pg) {
    auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
    std::vector<ParameterSpec> params = {{100}, {100}, {100}};
    ReducerOptions opt;
    opt.find_unused_parameters = true;
    opt.first_bucket_bytes = 400;
    opt.bucket_cap_bytes = 400;  // one parameter per bucket
    opt.broadcast_parameters = false;  // (values are not what these tests check)
      Reducer red(shared, params, opt);
    red.zero_grad();
    // Rank 0 uses parameters 0 and 1; rank 1 uses only 2 (different control flow per rank).
    std::vector<std::size_t> used = r == 0 ? std::vector<std::size_t>{0, 1} : std::vector<std::size_t>{2};
    for (auto k : used) {
      std::fill_n(red.grad_as<float>(k), 100, 2.0f * static_cast<float>(r + 1));
      red.mark_ready(k);
    }
    red.finalize();  // does not deadlock: rank 0 contributes zeros for 2, rank 1 for 0 and 1
    RANK_CHECK(red.grad_as<float>(0)[0] == 1.0f);  // (2 + 0) / 2
    RANK_CHECK(red.grad_as<float>(1)[99] == 1.0f);
    RANK_CHECK(red.grad_as<float>(2)[50] == 2.0f);  // (0 + 4) / 2
  });
  ranks.run(1, [](int, ProcessGroup& pg) {
    auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
    Reducer red(shared, {{10}, {10}}, ReducerOptions{.broadcast_parameters = false});
    red.mark_ready(1);
    RANK_CHECK_THROWS_WITH(red.finalize(), "parameter(s) 0 received no gradient");
    red.mark_ready(0);
    RANK_CHECK_THROWS_WITH(red.mark_ready(0), "marked ready twice");
  });
}

TEST_CASE("compressed buckets stay within the format's error bound", "[reducer]") {
  test::Ranks ranks;
  for (auto c : {Compression::kFloat16, Compression::kBFloat16}) {
    double bound = c == Compression::kFloat16 ? 1e-3 : 8e-3;  // relative, of the largest input
    ranks.run(2, [&](int r, ProcessGroup& pg) {
      auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
      ReducerOptions opt;
      opt.compression = c;
      opt.broadcast_parameters = false;
      Reducer red(shared, {{100000}}, opt);
      std::mt19937 g(42 + static_cast<unsigned>(r));
      // Each stream has its own distribution: they cache values, so sharing one would mix them.
      std::normal_distribution<float> d(0.0f, 1e-2f), d_other(0.0f, 1e-2f);  // gradient-like magnitudes
      std::vector<float> mine(100000), other(100000);
      std::mt19937 g_other(42 + static_cast<unsigned>(1 - r));
      for (std::size_t i = 0; i < mine.size(); ++i) {
        mine[i] = d(g);
        other[i] = d_other(g_other);
      }
      std::copy(mine.begin(), mine.end(), red.grad_as<float>(0));
      red.mark_ready(0);
      red.finalize();
      double max_abs = 0, max_err = 0;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        double exact = (static_cast<double>(mine[i]) + other[i]) / 2;
        max_abs = std::max(max_abs, std::abs(exact));
        max_err = std::max(max_err, std::abs(red.grad_as<float>(0)[i] - exact));
      }
      RANK_CHECK_MSG(max_err <= bound * max_abs * 2, max_err << " vs " << bound * max_abs * 2);
      RANK_CHECK(max_err > 0);  // it really went through 16 bits
    });
  }
}

TEST_CASE("broadcast_tensors makes replicas identical", "[reducer]") {
  test::Ranks ranks;
  ranks.run(3, [](int r, ProcessGroup& pg) {
    std::vector<float> w(1000, static_cast<float>(r));
    std::vector<std::int64_t> step(1, r * 10);
    broadcast_tensors(pg, {{w.data(), w.size(), DataType::kFloat32}, {step.data(), 1, DataType::kInt64}});
    RANK_CHECK(w[999] == 0.0f);
    RANK_CHECK(step[0] == 0);
  });
}

TEST_CASE("checkpoints are atomic, and damage is detected", "[checkpoint]") {
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / ("ddprun-ckpt-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto path = (dir / "model.ckpt").string();
  CHECK_FALSE(load_checkpoint(path).has_value());
  save_checkpoint(path, "first");
  save_checkpoint(path, std::string("second\0bytes", 12));
  CHECK(load_checkpoint(path).value() == std::string("second\0bytes", 12));
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename() == "model.ckpt");  // no temp files left
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(18);
    f.put('X');
  }
  CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains("damaged"));
  std::ofstream(path) << "garbage";
  CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains("not a ddprun checkpoint"));
  CHECK_THROWS_AS(save_checkpoint((dir / "no/such/dir/x").string(), "x"), ddprun::Error);
  fs::remove_all(dir);
}

TEST_CASE("DistributedSampler partitions like PyTorch's (shape checks)", "[sampler]") {
  // Exact equality with PyTorch is checked by tests/python/runtime_torch_test.py.
  for (bool drop_last : {false, true}) {
    std::size_t n = 103;
    std::vector<std::int64_t> all;
    for (int r = 0; r < 4; ++r) {
      DistributedSampler s(n, 4, r, true, 7, drop_last);
      s.set_epoch(3);
      auto idx = s.indices();
      CHECK(idx.size() == s.num_samples());
      all.insert(all.end(), idx.begin(), idx.end());
    }
    std::sort(all.begin(), all.end());
    if (drop_last) {
      CHECK(all.size() == 100);
      CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no repeats
    } else {
      CHECK(all.size() == 104);  // padded by one repeat
    }
  }
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), ddprun::UsageError);
}
