#include "ddprun/runtime/sampler.hpp"

#include <numeric>
#include <random>
#include <string>

#include "ddprun/common/error.hpp"

namespace ddprun::runtime {

std::vector<std::int64_t> torch_randperm(std::size_t n, std::uint64_t seed) {
  // PyTorch's CPU generator is the standard MT19937 seeded with the low 32 bits; randperm_cpu
  // does this Fisher-Yates variant with 32-bit draws.
  std::mt19937 gen(static_cast<std::uint32_t>(seed & 0xffffffffu));
  std::vector<std::int64_t> r(n);
  std::iota(r.begin(), r.end(), 0);
  for (std::size_t i = 0; i + 1 < n; ++i) {
    std::size_t z = static_cast<std::uint32_t>(gen()) % (n - i);
    std::swap(r[i], r[z + i]);
  }
  return r;
}

DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       std::uint64_t seed, bool drop_last)
    : size_(dataset_size), replicas_(num_replicas), rank_(rank), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw UsageError("DistributedSampler: rank " + std::to_string(rank) + " is not in [0, " +
                     std::to_string(num_replicas) + ")");
  }
  auto r = static_cast<std::size_t>(replicas_);
  if (drop_last_ && size_ % r != 0) {
    num_samples_ = (size_ - r + r - 1) / r;  // ceil((n - r) / r), as PyTorch
    if (size_ < r) num_samples_ = 0;
  } else {
    num_samples_ = (size_ + r - 1) / r;
  }
  total_size_ = num_samples_ * r;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  std::vector<std::int64_t> idx;
  if (shuffle_) {
    idx = torch_randperm(size_, seed_ + epoch_);
  } else {
    idx.resize(size_);
    std::iota(idx.begin(), idx.end(), 0);
  }
  if (!drop_last_) {
    // Pad by repeating from the start (several times over when the dataset is tiny).
    std::size_t pad = total_size_ - idx.size();
    std::size_t original = idx.size();
    for (std::size_t k = 0; k < pad && original > 0; ++k) idx.push_back(idx[k % original]);
  } else {
    idx.resize(total_size_);
  }
  std::vector<std::int64_t> mine;
  mine.reserve(num_samples_);
  for (std::size_t k = static_cast<std::size_t>(rank_); k < total_size_; k += static_cast<std::size_t>(replicas_)) {
    mine.push_back(idx[k]);
  }
  return mine;
}

}  // namespace ddprun::runtime
