#pragma once
// A few integers from every rank, on the host (private): an all_gather through the group's own
// memory (device memory on nccl), for what the ranks must agree on before they go on.

#include <cstdint>
#include <vector>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::runtime {

// Every rank's `mine` (the same length on every rank), in rank order. A collective.
inline std::vector<std::int64_t> all_gather_on_host(ProcessGroup& group, const std::vector<std::int64_t>& mine) {
  const std::size_t in_bytes = mine.size() * sizeof(std::int64_t);
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(group.size()));
  char* buf = static_cast<char*>(group.allocate(in_bytes + all.size() * sizeof(std::int64_t)));
  try {
    group.copy_to_device(buf, mine.data(), in_bytes);
    group.all_gather(buf, buf + in_bytes, mine.size(), DataType::kInt64);
    group.copy_to_host(all.data(), buf + in_bytes, all.size() * sizeof(std::int64_t));
  } catch (...) {
    group.deallocate(buf);
    throw;
  }
  group.deallocate(buf);
  return all;
}

}  // namespace ddprun::runtime
