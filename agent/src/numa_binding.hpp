#pragma once
// CPU and memory binding per local rank (--numa_binding), planned with hwloc, applied in the
// child before exec (sched_setaffinity, set_mempolicy: no numactl needed). torchrun's modes:
//   node          every core of the rank's NUMA node
//   socket        every core of the socket (package) holding the rank's NUMA node
//   exclusive     the rank's NUMA node's cores, split between the ranks that share the node
//   core-complex  one L3 cache domain of the rank's NUMA node, distinct for ranks sharing it
// The rank's NUMA node: on GPU nodes the one nearest its GPU (hwloc's PCI locality, GPUs in PCI
// bus order, CUDA_VISIBLE_DEVICES honoured); elsewhere ranks are spread evenly over the nodes.
// Memory: the rank's NUMA node is preferred (first touch lands there; a full node spills
// instead of failing).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/options.hpp"

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

  // The NUMA node (logical index) nearest each GPU, in PCI bus order; empty without GPUs.
  std::vector<int> gpu_numa_nodes() const;

  struct Impl;

 private:
  friend std::vector<CpuBinding> plan_bindings(const Topology&, int, NumaMode, const std::vector<int>&);
  explicit Topology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where each of `nproc` local ranks goes. `gpu_numa`: the NUMA node of each local rank's GPU
// (empty: spread evenly). Throws UsageError when the mode cannot be honoured (more ranks than
// cores to split).
std::vector<CpuBinding> plan_bindings(const Topology& topo, int nproc, NumaMode mode,
                                      const std::vector<int>& gpu_numa = {});

// "cores 0-7,16-23 (8 PUs), NUMA node 0".
std::string describe_binding(const CpuBinding& b);
// "0-3,8,10-11".
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace ddprun::agent
