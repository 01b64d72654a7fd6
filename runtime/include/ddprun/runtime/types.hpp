#pragma once
// Element types and reduction operations of collectives.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::runtime {

enum class DataType : std::uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMin, kMax };

// Bytes per element.
std::size_t element_size(DataType type);
const char* name(DataType type);
const char* name(ReduceOp op);

// IEEE half and bfloat16 conversions (round to nearest even), for buffers of those types.
std::uint16_t float_to_half(float f);
float half_to_float(std::uint16_t h);
std::uint16_t float_to_bfloat16(float f);
float bfloat16_to_float(std::uint16_t b);

}  // namespace ddprun::runtime
