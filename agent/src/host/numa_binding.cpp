#include "host/numa_binding.hpp"

#include <algorithm>
#include <map>

#include "ddprun/build_info.hpp"
#include "ddprun/common/error.hpp"

#if DDPRUN_FEATURE_HWLOC
#include "host/hwloc_lazy.hpp"
#endif

namespace ddprun::agent {

std::optional<NumaMode> parse_numa_mode(const std::string& text) {
  if (text == "node") return NumaMode::node;
  if (text == "socket") return NumaMode::socket;
  if (text == "exclusive") return NumaMode::exclusive;
  if (text == "core-complex" || text == "core_complex") return NumaMode::core_complex;
  return std::nullopt;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return out;
}

std::string describe_binding(const CpuBinding& b) {
  return "cpus " + cpu_list(b.cpus) + " (" + std::to_string(b.cpus.size()) + "), NUMA node " +
         (b.numa_node >= 0 ? std::to_string(b.numa_node) : std::string("any"));
}

#if DDPRUN_FEATURE_HWLOC

struct Topology::Impl {
  hwloc_topology_t t = nullptr;
  ~Impl() {
    if (t) hwloc_topology_destroy(t);
  }
};

namespace {

std::unique_ptr<Topology::Impl> make(const char* synthetic) {
  load_hwloc();
  auto impl = std::make_unique<Topology::Impl>();
  if (hwloc_topology_init(&impl->t) != 0) throw Error("hwloc: cannot initialise a topology");
  if (synthetic && hwloc_topology_set_synthetic(impl->t, synthetic) != 0) {
    throw UsageError(std::string("hwloc: bad synthetic topology '") + synthetic + "'");
  }
  if (hwloc_topology_load(impl->t) != 0) throw Error("hwloc: cannot read this machine's topology");
  return impl;
}

std::vector<int> pus_of(hwloc_const_cpuset_t set) {
  std::vector<int> out;
  unsigned id;
  hwloc_bitmap_foreach_begin(id, set) { out.push_back(static_cast<int>(id)); }
  hwloc_bitmap_foreach_end();
  return out;
}

// The PUs of the objects of `type` inside `set`, one list per object.
std::vector<std::vector<int>> parts(hwloc_topology_t t, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
  std::vector<std::vector<int>> out;
  int n = hwloc_get_nbobjs_inside_cpuset_by_type(t, set, type);
  for (int i = 0; i < n; ++i) out.push_back(pus_of(hwloc_get_obj_inside_cpuset_by_type(t, set, type, i)->cpuset));
  return out;
}

// Ranks placed on NUMA nodes: by their GPU, else spread evenly (contiguous blocks).
std::vector<int> node_of_rank(int nproc, int nodes, const std::vector<int>& gpu_numa) {
  std::vector<int> out(nproc);
  for (int r = 0; r < nproc; ++r) {
    bool by_gpu = static_cast<int>(gpu_numa.size()) >= nproc && gpu_numa[r] >= 0;
    out[r] = by_gpu ? gpu_numa[r] : static_cast<int>(static_cast<long>(r) * nodes / nproc);
  }
  return out;
}

CpuBinding bind_in_node(hwloc_topology_t t, hwloc_obj_t numa, NumaMode mode, int k, int sharing) {
  CpuBinding b;
  b.numa_node = static_cast<int>(numa->os_index);
  if (mode == NumaMode::node) {
    b.cpus = pus_of(numa->cpuset);
  } else if (mode == NumaMode::socket) {
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, numa);
    b.cpus = pus_of(pkg ? pkg->cpuset : numa->cpuset);
  } else if (mode == NumaMode::core_complex) {
    auto l3 = parts(t, numa->cpuset, HWLOC_OBJ_L3CACHE);
    b.cpus = l3.empty() ? pus_of(numa->cpuset) : l3[static_cast<std::size_t>(k) % l3.size()];
  } else {  // exclusive: this rank's share of the node's cores (all PUs of each core)
    auto cores = parts(t, numa->cpuset, HWLOC_OBJ_CORE);
    if (static_cast<int>(cores.size()) < sharing) {
      throw UsageError("--numa_binding=exclusive: " + std::to_string(sharing) + " local ranks share NUMA node " +
                       std::to_string(numa->os_index) + ", which has " + std::to_string(cores.size()) +
                       " cores; use node, or fewer --nproc_per_node");
    }
    std::size_t lo = cores.size() * k / sharing, hi = cores.size() * (k + 1) / sharing;
    for (std::size_t c = lo; c < hi; ++c) b.cpus.insert(b.cpus.end(), cores[c].begin(), cores[c].end());
  }
  std::sort(b.cpus.begin(), b.cpus.end());
  return b;
}

}  // namespace

Topology::Topology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Topology::~Topology() = default;
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology Topology::load() { return Topology(make(nullptr)); }
Topology Topology::synthetic(const std::string& description) { return Topology(make(description.c_str())); }

std::vector<int> Topology::gpu_numa_nodes() const { return numa_nodes_of(find_visible_gpus(), "/sys"); }

std::vector<int> Topology::numa_nodes_of(const std::vector<VisibleGpu>& gpus, const std::string& sys_root) const {
  std::vector<int> out;
  for (const auto& g : gpus) {
    int os = pci_numa_node(g.pci_bus_id, sys_root);
    hwloc_obj_t node = os >= 0 ? hwloc_get_numanode_obj_by_os_index(impl_->t, static_cast<unsigned>(os)) : nullptr;
    out.push_back(node ? static_cast<int>(node->logical_index) : -1);
  }
  return out;
}

std::vector<CpuBinding> plan_bindings(const Topology& topo, int nproc, NumaMode mode, const std::vector<int>& gpu_numa) {
  hwloc_topology_t t = topo.impl_->t;
  int nodes = std::max(1, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE));
  auto where = node_of_rank(nproc, nodes, gpu_numa);
  std::map<int, int> sharing, seen;
  for (int n : where) ++sharing[n];
  std::vector<CpuBinding> out;
  for (int r = 0; r < nproc; ++r) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(where[r] % nodes));
    if (!numa) throw Error("hwloc: this machine reports no NUMA node");
    out.push_back(bind_in_node(t, numa, mode, seen[where[r]]++, sharing[where[r]]));
  }
  return out;
}

#else  // built without hwloc

struct Topology::Impl {};
Topology::Topology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Topology::~Topology() = default;
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology Topology::load() { throw UsageError("--numa_binding: this ddprun was built without hwloc (apt-get install libhwloc-dev, rebuild)"); }
Topology Topology::synthetic(const std::string&) { return load(); }
std::vector<int> Topology::gpu_numa_nodes() const { return {}; }
std::vector<int> Topology::numa_nodes_of(const std::vector<VisibleGpu>&, const std::string&) const { return {}; }
std::vector<CpuBinding> plan_bindings(const Topology&, int, NumaMode, const std::vector<int>&) { return {}; }

#endif

}  // namespace ddprun::agent
