#pragma once
// Reads and writes of a state area (workers/state_areas.hpp) through the agent's descriptor: its
// bytes, and its 64-bit words (state_layout.hpp). Each throws ddprun::Error with the system's reason.

#include <cstdint>
#include <cstring>
#include <spdlog/fmt/fmt.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/common/system.hpp"

namespace ddprun::agent::area_io {

inline void read(int fd, unsigned char* buf, std::size_t n, std::uint64_t at) {
  if (const int e = pread_full(fd, buf, n, at)) throw Error(fmt::format("reading a state area: {}", std::strerror(e)));
}

inline void write(int fd, const unsigned char* buf, std::size_t n, std::uint64_t at) {
  if (const int e = pwrite_full(fd, buf, n, at)) throw Error(fmt::format("writing a state area: {}", std::strerror(e)));
}

inline void put_u64(int fd, std::uint64_t at, std::uint64_t v) {
  unsigned char b[8];
  state_layout::write_at(b, v);
  write(fd, b, 8, at);
}

inline std::uint64_t get_u64(int fd, std::uint64_t at) {
  unsigned char b[8];
  read(fd, b, 8, at);
  return state_layout::read_at<std::uint64_t>(b);
}

}  // namespace ddprun::agent::area_io
