// CPU and NUMA binding plans on hwloc's synthetic topologies: every mode, many rank counts.
#include <catch2/catch.hpp>

#include <set>

#include "ddprun/build_info.hpp"
#include "ddprun/common/error.hpp"
#include "host/numa_binding.hpp"

using namespace ddprun::agent;

namespace {

// 2 sockets x 2 NUMA nodes x 2 L3 domains x 4 cores, one PU each: PUs 0-31, NUMA node n holds
// PUs 8n..8n+7, socket s holds NUMA nodes 2s and 2s+1, each L3 four cores.
const char* kMachine = "pack:2 numa:2 l3:2 core:4 pu:1";

std::vector<CpuBinding> plan(int nproc, NumaMode mode, std::vector<int> gpus = {}) {
  return plan_bindings(Topology::synthetic(kMachine), nproc, mode, gpus);
}

std::vector<int> range(int lo, int hi) {
  std::vector<int> v;
  for (int i = lo; i <= hi; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("numa: node binds each rank to all of its NUMA node, ranks spread evenly", "[numa]") {
  if (!DDPRUN_FEATURE_HWLOC) return;
  auto p = plan(4, NumaMode::node);
  for (int r = 0; r < 4; ++r) {
    CHECK(p[r].numa_node == r);
    CHECK(p[r].cpus == range(8 * r, 8 * r + 7));
  }
  auto eight = plan(8, NumaMode::node);
  CHECK(eight[0].numa_node == 0);
  CHECK(eight[1].numa_node == 0);
  CHECK(eight[2].numa_node == 1);
  CHECK(eight[7].numa_node == 3);
  auto two = plan(2, NumaMode::node);  // fewer ranks than nodes: every other node
  CHECK(two[0].numa_node == 0);
  CHECK(two[1].numa_node == 2);
  CHECK(describe_binding(p[1]) == "cpus 8-15 (8), NUMA node 1");
}

TEST_CASE("numa: socket binds each rank to the whole socket of its NUMA node", "[numa]") {
  if (!DDPRUN_FEATURE_HWLOC) return;
  auto p = plan(4, NumaMode::socket);
  CHECK(p[0].cpus == range(0, 15));
  CHECK(p[1].cpus == range(0, 15));
  CHECK(p[1].numa_node == 1);  // memory: its own node
  CHECK(p[2].cpus == range(16, 31));
  CHECK(p[3].cpus == range(16, 31));
}

TEST_CASE("numa: exclusive splits a node's cores between the ranks sharing it - never overlapping", "[numa]") {
  if (!DDPRUN_FEATURE_HWLOC) return;
  auto p = plan(8, NumaMode::exclusive);
  CHECK(p[0].cpus == range(0, 3));
  CHECK(p[1].cpus == range(4, 7));
  CHECK(p[1].numa_node == 0);
  CHECK(p[2].cpus == range(8, 11));
  for (int n : {1, 2, 3, 4, 5, 8, 12, 16, 24, 32}) {
    CAPTURE(n);
    auto q = plan(n, NumaMode::exclusive);
    std::set<int> used;
    std::size_t total = 0;
    for (const auto& b : q) {
      CHECK_FALSE(b.cpus.empty());
      for (int c : b.cpus) CHECK(c / 8 == b.numa_node);  // inside its own node
      used.insert(b.cpus.begin(), b.cpus.end());
      total += b.cpus.size();
    }
    CHECK(used.size() == total);  // disjoint
  }
  CHECK_THROWS_WITH(plan(40, NumaMode::exclusive), Catch::Contains("which has 8 cores"));
}

TEST_CASE("numa: core-complex gives ranks sharing a node distinct L3 domains", "[numa]") {
  if (!DDPRUN_FEATURE_HWLOC) return;
  auto p = plan(8, NumaMode::core_complex);
  CHECK(p[0].cpus == range(0, 3));
  CHECK(p[1].cpus == range(4, 7));
  CHECK(p[6].cpus == range(24, 27));
  auto four = plan(4, NumaMode::core_complex);  // one rank per node: its node's first L3
  CHECK(four[3].cpus == range(24, 27));
}

TEST_CASE("numa: on GPU nodes each rank binds nearest its GPU", "[numa]") {
  if (!DDPRUN_FEATURE_HWLOC) return;
  auto p = plan(4, NumaMode::node, {3, 3, 0, 1});  // GPUs 0 and 1 hang off node 3
  CHECK(p[0].numa_node == 3);
  CHECK(p[1].cpus == range(24, 31));
  CHECK(p[2].numa_node == 0);
  auto ex = plan(4, NumaMode::exclusive, {3, 3, 0, 1});
  CHECK(ex[0].cpus == range(24, 27));  // the two ranks of node 3 share it exclusively
  CHECK(ex[1].cpus == range(28, 31));
  CHECK(ex[2].cpus == range(0, 7));
}

TEST_CASE("numa: modes by name, CPU lists as the kernel writes them", "[numa]") {
  CHECK(parse_numa_mode("core-complex") == NumaMode::core_complex);
  CHECK(parse_numa_mode("core_complex") == NumaMode::core_complex);
  CHECK_FALSE(parse_numa_mode("nodes"));
  CHECK(cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(cpu_list({}).empty());
}
