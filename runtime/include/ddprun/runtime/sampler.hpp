#pragma once
// PyTorch's DistributedSampler, index for index: the same shuffle (torch.randperm with a
// generator seeded by seed + epoch), the same padding or drop_last, the same rank striding. A
// C++ job and a PyTorch job over the same dataset shard it identically.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddprun::runtime {

class DistributedSampler {
 public:
  // Throws ddprun::UsageError when rank is not in [0, num_replicas).
  DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     std::uint64_t seed = 0, bool drop_last = false);

  // Reshuffles for a new epoch (the order differs per epoch and is the same on every rank).
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  // This rank's indices for the current epoch; num_samples() of them.
  std::vector<std::int64_t> indices() const;
  std::size_t num_samples() const { return num_samples_; }
  std::size_t total_size() const { return total_size_; }

 private:
  std::size_t size_;
  int replicas_, rank_;
  bool shuffle_, drop_last_;
  std::uint64_t seed_, epoch_ = 0;
  std::size_t num_samples_, total_size_;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
std::vector<std::int64_t> torch_randperm(std::size_t n, std::uint64_t seed);

}  // namespace ddprun::runtime
