#pragma once
// CPU and memory binding per local rank (--numa_binding), planned with hwloc, applied in the
// child before exec (sched_setaffinity, set_mempolicy: no numactl needed). torchrun's modes:
//   node          every core of the rank's NUMA node
//   socket        every core of the socket (package) holding the rank's NUMA node
//   exclusive     the rank's NUMA node's cores, split between the ranks that share the node
//   core-complex  one L3 cache domain of the rank's NUMA node, distinct for ranks sharing it
// The rank's NUMA node: on GPU nodes the one of its GPU, the local rank's entry among the GPUs
// CUDA_VISIBLE_DEVICES leaves visible (ddprun/agent/gpus.hpp), found by the GPU's PCI bus id;
// elsewhere (and for a GPU whose node is unknown) ranks are spread evenly over the nodes.
// Memory: the rank's NUMA node is preferred (first touch lands there; a full node spills
// instead of failing).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/gpus.hpp"
#include "ddprun/agent/agent_options.hpp"

namespace ddprun::agent {

enum class NumaMode { node, socket, exclusive, core_complex };
// "node", "socket", "exclusive", "core-complex" (or "core_complex"); nullopt otherwise.
std::optional<NumaMode> parse_numa_mode(const std::string& text);

// The machine's topology (hwloc). Throws ddprun::Error when it cannot be read, or when ddprun
// was built without hwloc.
class Topology {
 public:
  static Topology load();
  // hwloc's synthetic description, e.g. "pack:2 numa:2 l3:2 core:4 pu:1" (tests).
  static Topology synthetic(const std::string& description);
  ~Topology();
  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;

  // The NUMA node (logical index; -1 unknown) of each GPU this process sees, in CUDA's order;
  // empty without GPUs.
  std::vector<int> gpu_numa_nodes() const;
  // The same for `gpus`, their PCI devices' NUMA nodes read under `sys_root` (tests: a fake).
  std::vector<int> numa_nodes_of(const std::vector<VisibleGpu>& gpus, const std::string& sys_root) const;

  struct Impl;

 private:
  friend std::vector<CpuBinding> plan_bindings(const Topology&, int, NumaMode, const std::vector<int>&);
  explicit Topology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where each of `nproc` local ranks goes. `gpu_numa`: the NUMA node of each local rank's GPU
// (empty, fewer than nproc, or -1: spread evenly). Throws UsageError when the mode cannot be honoured (more ranks than
// cores to split).
std::vector<CpuBinding> plan_bindings(const Topology& topo, int nproc, NumaMode mode,
                                      const std::vector<int>& gpu_numa = {});

// "cores 0-7,16-23 (8 PUs), NUMA node 0".
std::string describe_binding(const CpuBinding& b);
// "0-3,8,10-11".
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace ddprun::agent
