// Every collective, dtype and op against a serial reference, over gloo with ranks as threads.

#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <random>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/env.hpp"
#include "group_fixture.hpp"

using namespace ddprun;
using namespace ddprun::runtime;
using namespace std::chrono_literals;

namespace {

// Value of element i on rank r, small integers so every type represents sums exactly.
double value(int r, std::size_t i) { return static_cast<double>((r * 7 + static_cast<int>(i % 13) * 3) % 17) - 8; }

template <typename T>
T to(double v, DataType t) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return t == DataType::kFloat16 ? float_to_half(static_cast<float>(v)) : float_to_bfloat16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
double from(T v, DataType t) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return t == DataType::kFloat16 ? half_to_float(v) : bfloat16_to_float(v);
  } else {
    return static_cast<double>(v);
  }
}

double reference(ReduceOp op, int size, std::size_t i, bool integer) {
  double acc = value(0, i);
  for (int r = 1; r < size; ++r) {
    double v = value(r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
  }
  if (op == ReduceOp::kAvg) acc = integer ? std::trunc(acc / size) : acc / size;
  return acc;
}

template <typename T>
void check_all_reduce(test::Ranks& ranks, int size, DataType t, ReduceOp op, std::size_t n) {
  bool integer = t == DataType::kInt32 || t == DataType::kInt64;
  ranks.run(size, [&](int r, ProcessGroup& pg) {
    std::vector<T> buf(n);
    for (std::size_t i = 0; i < n; ++i) buf[i] = to<T>(value(r, i), t);
    pg.all_reduce(buf.data(), n, t, op);
    for (std::size_t i = 0; i < n; ++i) {
      double want = reference(op, size, i, integer);
      double tol = (t == DataType::kBFloat16 || t == DataType::kFloat16) ? std::abs(want) * 1e-2 + 1e-2 : 1e-6;
      if (std::abs(from<T>(buf[i], t) - want) > tol) {
        RANK_FAIL("rank " << r << " " << name(t) << " " << name(op) << " n=" << n << " i=" << i << ": "
                          << from<T>(buf[i], t) << " != " << want);
      }
    }
  });
}

void all_reduce_case(test::Ranks& ranks, int size, DataType t, ReduceOp op, std::size_t n) {
  switch (t) {
    case DataType::kFloat32: return check_all_reduce<float>(ranks, size, t, op, n);
    case DataType::kFloat64: return check_all_reduce<double>(ranks, size, t, op, n);
    case DataType::kInt32: return check_all_reduce<std::int32_t>(ranks, size, t, op, n);
    case DataType::kInt64: return check_all_reduce<std::int64_t>(ranks, size, t, op, n);
    case DataType::kFloat16:
    case DataType::kBFloat16: return check_all_reduce<std::uint16_t>(ranks, size, t, op, n);
  }
}

}  // namespace

TEST_CASE("all_reduce: every dtype and op, sizes 0, 1 and a prime, 3 ranks", "[collectives]") {
  test::Ranks ranks;
  for (auto t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32,
                 DataType::kInt64}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1009}}) {
        INFO(name(t) << " " << name(op) << " n=" << n);
        all_reduce_case(ranks, 3, t, op, n);
      }
    }
  }
}

TEST_CASE("all_reduce: tens of MB", "[collectives]") {
  test::Ranks ranks;
  all_reduce_case(ranks, 2, DataType::kFloat32, ReduceOp::kSum, 6 * 1024 * 1024);  // 24 MiB per rank
  all_reduce_case(ranks, 2, DataType::kFloat64, ReduceOp::kAvg, 2 * 1024 * 1024 + 3);
}

TEST_CASE("broadcast, all_gather, reduce_scatter, barrier", "[collectives]") {
  test::Ranks ranks;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1009}, std::size_t{3} << 20}) {
    INFO("n=" << n);
    ranks.run(4, [&](int r, ProcessGroup& pg) {
      // broadcast from rank 2
      std::vector<double> b(n, r);
      pg.broadcast(b.data(), n, DataType::kFloat64, 2);
      for (auto v : b) RANK_CHECK(v == 2.0);
      // all_gather: block k holds rank k's values
      std::vector<std::int64_t> mine(n), all(n * 4, -1);
      for (std::size_t i = 0; i < n; ++i) mine[i] = r * 1000000 + static_cast<std::int64_t>(i);
      pg.all_gather(mine.data(), all.data(), n, DataType::kInt64);
      for (int k = 0; k < 4; ++k) {
        for (std::size_t i = 0; i < n; i += 97) RANK_CHECK(all[k * n + i] == k * 1000000 + static_cast<std::int64_t>(i));
      }
      // reduce_scatter: rank r receives the sum of block r
      std::vector<float> in(n * 4), out(n, -1);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(value(r, i));
      pg.reduce_scatter(in.data(), out.data(), n, DataType::kFloat32, ReduceOp::kSum);
      for (std::size_t i = 0; i < n; i += 89) {
        double want = 0;
        for (int k = 0; k < 4; ++k) want += value(k, r * n + i);
        RANK_CHECK(out[i] == static_cast<float>(want));
      }
      pg.barrier();
    });
  }
}

TEST_CASE("asynchronous all_reduces complete in issue order", "[collectives]") {
  test::Ranks ranks;
  ranks.run(2, [](int r, ProcessGroup& pg) {
    std::vector<std::vector<float>> bufs(8, std::vector<float>(10000));
    std::vector<std::shared_ptr<Work>> works;
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(k + r));
      works.push_back(pg.all_reduce_async(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kSum));
    }
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      works[k]->wait();
      RANK_CHECK(bufs[k][123] == static_cast<float>(2 * k + 1));
    }
  });
}

TEST_CASE("a rank that never joins a collective gives a timeout error, not a hang", "[collectives]") {
  test::Ranks ranks;
  ProcessGroupOptions opt;
  opt.timeout = 1500ms;
  auto t0 = std::chrono::steady_clock::now();
  try {
    ranks.run(2, [](int r, ProcessGroup& pg) {
      if (r == 1) return;  // rank 1 skips the collective (and closes its group)
      float x = 1;
      pg.all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, std::chrono::milliseconds(800));
    }, opt);
    FAIL("the all_reduce completed without its peer");
  } catch (const ddprun::Error& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("all_reduce on rank 0 of 2"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("the environment contract: clear errors naming the variable", "[env]") {
  std::map<std::string, std::string> env = {{"RANK", "1"},          {"WORLD_SIZE", "4"},       {"LOCAL_RANK", "1"},
                                            {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
                                            {"TORCHELASTIC_RESTART_COUNT", "2"}};
  auto e = DistEnv::from_map(env);
  CHECK(e.rank == 1);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  CHECK(e.restart_count == 2);
  CHECK(e.master_port == 29500);
  CHECK(e.run_id == "none");
  auto bad = [&](const std::string& k, const std::string& v) {
    auto m = env;
    if (v.empty()) {
      m.erase(k);
    } else {
      m[k] = v;
    }
    return m;
  };
  CHECK_THROWS_WITH(DistEnv::from_map(bad("RANK", "")), Catch::Contains("environment variable RANK is not set"));
  CHECK_THROWS_WITH(DistEnv::from_map(bad("RANK", "x1")), Catch::Contains("RANK=x1 is not an integer"));
  CHECK_THROWS_WITH(DistEnv::from_map(bad("RANK", "4")), Catch::Contains("RANK=4 is out of range (0..3, since WORLD_SIZE=4)"));
  CHECK_THROWS_WITH(DistEnv::from_map(bad("MASTER_PORT", "70000")), Catch::Contains("MASTER_PORT=70000 is out of range"));
  CHECK_THROWS_WITH(DistEnv::from_map(bad("MASTER_ADDR", "")), Catch::Contains("MASTER_ADDR is not set"));
  CHECK_THROWS_AS(runtime::create_process_group("mpi", nullptr, 0, 1), ddprun::UsageError);
  // Only RANK set, and wrong: the error is about RANK, not about the WORLD_SIZE that is missing.
  CHECK_THROWS_WITH(DistEnv::from_map({{"RANK", "abc"}}), Catch::Contains("RANK=abc is not an integer"));
  CHECK_THROWS_WITH(DistEnv::from_map({{"RANK", "1"}}), Catch::Contains("environment variable WORLD_SIZE is not set"));
}

TEST_CASE("no launcher variable at all: a world of one", "[env]") {
  auto e = DistEnv::from_map({{"PATH", "/usr/bin"}, {"TORCHELASTIC_RESTART_COUNT", "0"}});
  CHECK(e.standalone);
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_world_size == 1);
  auto pg = init_process_group("gloo", e);
  CHECK(pg->size() == 1);
  float x = 3;
  pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kAvg);
  CHECK(x == 3);
  // One launcher variable set: the others are required.
  CHECK_THROWS_WITH(DistEnv::from_map({{"MASTER_PORT", "29500"}}), Catch::Contains("environment variable RANK is not set"));
}

TEST_CASE("16-bit float conversions round to nearest even", "[types]") {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-5f, 3.14159f, -0.0001f}) {
    CHECK(std::abs(half_to_float(float_to_half(f)) - f) <= std::abs(f) * 1e-3f + 6e-8f);
    CHECK(std::abs(bfloat16_to_float(float_to_bfloat16(f)) - f) <= std::abs(f) * 8e-3f);
  }
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_bfloat16(1.0f) == 0x3f80);
  CHECK(std::isinf(half_to_float(float_to_half(1e6f))));
  CHECK(half_to_float(float_to_half(1.0f + 1.0f / 2048)) == 1.0f);  // tie to even
}

TEST_CASE("reduce_scatter (ring): 2, 3 and 5 ranks, every op, and a time-out", "[collectives]") {
  test::Ranks ranks;
  for (int size : {2, 3, 5}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      INFO("size=" << size << " op=" << static_cast<int>(op));
      const std::size_t n = 1000 + static_cast<std::size_t>(size);
      ranks.run(size, [&](int r, ProcessGroup& pg) {
        std::vector<std::int64_t> in(n * size), out(n, -1);
        auto v = [](int rank, std::size_t i) { return static_cast<std::int64_t>((rank * 7919 + i * 31) % 1000) - 500; };
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = v(r, i);
        pg.reduce_scatter(in.data(), out.data(), n, DataType::kInt64, op);
        for (std::size_t i = 0; i < n; ++i) {
          std::int64_t want = v(0, r * n + i);
          std::int64_t sum = 0;
          for (int k = 0; k < size; ++k) {
            auto x = v(k, r * n + i);
            sum += x;
            if (op == ReduceOp::kMax) want = std::max(want, x);
            if (op == ReduceOp::kMin) want = std::min(want, x);
          }
          if (op == ReduceOp::kSum) want = sum;
          if (op == ReduceOp::kAvg) want = sum / size;
          if (out[i] != want) RANK_FAIL("rank " << r << " element " << i << ": " << out[i] << " != " << want);
        }
      });
    }
  }
  ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(300);
  std::atomic<bool> done{false};
  ranks.run(
      2,
      [&](int r, ProcessGroup& pg) {
        if (r == 1) {
          for (int i = 0; i < 300 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        std::vector<float> in(200), out(100);
        RANK_CHECK_THROWS_AS(pg.reduce_scatter(in.data(), out.data(), 100, DataType::kFloat32, ReduceOp::kSum),
                             ddprun::TimeoutError);
        done = true;
      },
      opt);
}
