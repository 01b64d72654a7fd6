#include "gloo_reduce.hpp"

#include <gloo/types.h>
#include <type_traits>

namespace ddprun::runtime {
namespace {

// ---- reduction functions: c[i] = a[i] op b[i] -------------------------------------------------

template <typename T, typename Op>
void reduce_plain(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<T*>(c);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  Op op;
  for (std::size_t i = 0; i < n; ++i) out[i] = op(x[i], y[i]);
}

// 16-bit floats: computed in float32, rounded once per element.
template <float (*ToF)(std::uint16_t), std::uint16_t (*FromF)(float), typename Op>
void reduce_16(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(c);
  auto* x = static_cast<const std::uint16_t*>(a);
  auto* y = static_cast<const std::uint16_t*>(b);
  Op op;
  for (std::size_t i = 0; i < n; ++i) out[i] = FromF(op(ToF(x[i]), ToF(y[i])));
}

struct Sum {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const { return b < a ? b : a; }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const { return a < b ? b : a; }
};

template <typename Op>
gloo::AllreduceOptions::Func reduce_for(DataType t) {
  switch (t) {
    case DataType::kFloat32: return reduce_plain<float, Op>;
    case DataType::kFloat64: return reduce_plain<double, Op>;
    case DataType::kInt32: return reduce_plain<std::int32_t, Op>;
    case DataType::kInt64: return reduce_plain<std::int64_t, Op>;
    case DataType::kFloat16: return reduce_16<half_to_float, float_to_half, Op>;
    case DataType::kBFloat16: return reduce_16<bfloat16_to_float, float_to_bfloat16, Op>;
  }
  return nullptr;
}

template <typename T>
void divide(T* p, std::size_t n, int by) {
  if constexpr (std::is_floating_point_v<T>) {
    // Dividing by a power of two is multiplying by its exact reciprocal: the same result, and
    // a multiply is several times cheaper than a division per element (profiled: the division
    // pass cost more than the reduction itself).
    if ((by & (by - 1)) == 0) {
      const T inv = T(1) / static_cast<T>(by);
      for (std::size_t i = 0; i < n; ++i) p[i] *= inv;
      return;
    }
  }
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / by);
}

// AVG = SUM / size, in the buffer's own type (integers truncate, as integer division does).
}  // namespace

gloo::AllreduceOptions::Func reduce_function(DataType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return reduce_for<Sum>(t);
    case ReduceOp::kMin: return reduce_for<Min>(t);
    case ReduceOp::kMax: return reduce_for<Max>(t);
  }
  return nullptr;
}

void divide_in_place(void* data, std::size_t n, DataType t, int by) {
  switch (t) {
    case DataType::kFloat32: return divide(static_cast<float*>(data), n, by);
    case DataType::kFloat64: return divide(static_cast<double*>(data), n, by);
    case DataType::kInt32: return divide(static_cast<std::int32_t*>(data), n, by);
    case DataType::kInt64: return divide(static_cast<std::int64_t*>(data), n, by);
    case DataType::kFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = float_to_half(half_to_float(p[i]) / static_cast<float>(by));
      return;
    }
    case DataType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = float_to_bfloat16(bfloat16_to_float(p[i]) / static_cast<float>(by));
      return;
    }
  }
}


}  // namespace ddprun::runtime
