// GPUs without CUDA: the driver's /proc entries (a fake tree), NVML (a fake library), CUDA's
// rules for CUDA_VISIBLE_DEVICES, the GPU memory a failed group still holds (NVML kept for the
// job), and each visible GPU's NUMA node by its PCI bus id (a fake sysfs on a synthetic hwloc
// topology).
#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddprun/agent/gpus.hpp"
#include "ddprun/build_info.hpp"
#include "host/numa_binding.hpp"
#include "skip.hpp"

using namespace ddprun::agent;
namespace fs = std::filesystem;

namespace {

struct FakeRoot {
  std::string root;
  FakeRoot() {
    std::string t = (fs::temp_directory_path() / "ddprun-gpus-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    root = t;
  }
  ~FakeRoot() { fs::remove_all(root); }
  void file(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(root + "/" + path).parent_path());
    std::ofstream(root + "/" + path) << text;
  }
  // A GPU as the NVIDIA driver lists it under /proc/driver/nvidia/gpus/.
  void gpu(const std::string& bus, const std::string& uuid) {
    file("proc/driver/nvidia/gpus/" + bus + "/information",
         "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 290\nGPU UUID: \t " + uuid +
             "\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t "
             "0xfffffffffffff\nBus Location: \t " + bus + "\nDevice Minor: \t 0\nGPU Excluded:\t No\n");
  }
};

const std::vector<GpuDevice> kFour = {
    {"GPU-aaaa1111-0000-0000-0000-000000000000", "0000:18:00.0", {}},
    {"GPU-bbbb2222-0000-0000-0000-000000000000", "0000:2a:00.0", {"MIG-cccc3333-0000-0000-0000-000000000000"}},
    {"GPU-bbbb9999-0000-0000-0000-000000000000", "0000:ab:00.0", {}},
    {"GPU-dddd4444-0000-0000-0000-000000000000", "0000:db:00.0", {}},
};

std::vector<std::string> buses(const std::vector<VisibleGpu>& v) {
  std::vector<std::string> out;
  for (const auto& g : v) out.push_back(g.pci_bus_id);
  return out;
}

}  // namespace

TEST_CASE("gpus: the driver's /proc entries, in PCI bus order", "[gpus]") {
  FakeRoot f;
  f.gpu("0000:db:00.0", "GPU-dddd4444-0000-0000-0000-000000000000");
  f.gpu("0000:18:00.0", "GPU-aaaa1111-0000-0000-0000-000000000000");
  f.file("proc/driver/nvidia/gpus/0000:2A:00.0/information", "Model: x\n");  // no UUID line: named by its directory
  auto gpus = gpus_from_proc(f.root + "/proc");
  REQUIRE(gpus.size() == 3);
  CHECK(gpus[0].pci_bus_id == "0000:18:00.0");
  CHECK(gpus[0].uuid == "GPU-aaaa1111-0000-0000-0000-000000000000");
  CHECK(gpus[1].pci_bus_id == "0000:2a:00.0");
  CHECK(gpus[1].uuid.empty());
  CHECK(gpus[2].pci_bus_id == "0000:db:00.0");
  CHECK(gpus_from_proc(f.root + "/nothing").empty());  // no driver: no GPU
}

TEST_CASE("gpus: CUDA_VISIBLE_DEVICES by index, UUID and MIG id, as CUDA reads it", "[gpus]") {
  CHECK(visible_gpus(kFour, nullptr, true).size() == 4);  // unset: every GPU
  CHECK(visible_gpus(kFour, "", true).empty());           // empty: none
  CHECK(visible_gpus(kFour, "-1", true).empty());
  CHECK(buses(visible_gpus(kFour, "3,1", true)) == std::vector<std::string>{"0000:db:00.0", "0000:2a:00.0"});
  CHECK(buses(visible_gpus(kFour, " 2 , 0 ", true)) == std::vector<std::string>{"0000:ab:00.0", "0000:18:00.0"});
  // The list ends at the first entry that names no device, or one named before.
  CHECK(buses(visible_gpus(kFour, "0,7,1", true)) == std::vector<std::string>{"0000:18:00.0"});
  CHECK(buses(visible_gpus(kFour, "1,GPU-bbbb2222,0", true)) == std::vector<std::string>{"0000:2a:00.0"});
  CHECK(visible_gpus(kFour, "cuda:0", true).empty());
  // UUIDs and unique prefixes of them; an ambiguous prefix names nothing.
  CHECK(buses(visible_gpus(kFour, "GPU-dddd4444-0000-0000-0000-000000000000,GPU-aaaa", true)) ==
        std::vector<std::string>{"0000:db:00.0", "0000:18:00.0"});
  CHECK(visible_gpus(kFour, "GPU-bbbb", true).empty());
  // MIG instances: by NVML's list, or the GPU named inside the old form; each is one device.
  auto mig = visible_gpus(kFour, "MIG-cccc3333-0000-0000-0000-000000000000,MIG-GPU-dddd4444-0000-0000-0000-000000000000/1/0", true);
  CHECK(buses(mig) == std::vector<std::string>{"0000:2a:00.0", "0000:db:00.0"});
  CHECK(mig[0].id == "MIG-cccc3333-0000-0000-0000-000000000000");
  CHECK(visible_gpus(kFour, "MIG-eeee", true).empty());  // NVML listed the instances: not one of them
  auto trusted = visible_gpus(kFour, "MIG-eeee", false);  // nothing to check it against: taken on trust
  REQUIRE(trusted.size() == 1);
  CHECK(trusted[0].pci_bus_id.empty());
}

TEST_CASE("gpus: NVML loaded at run time (a fake library), PCI bus ids as sysfs spells them", "[gpus]") {
  auto gpus = gpus_from_nvml(FAKE_NVML_LIB);
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].uuid == "GPU-11111111-aaaa-bbbb-cccc-000000000000");
  CHECK(gpus[0].pci_bus_id == "0000:18:00.0");
  CHECK(gpus[1].pci_bus_id == "0000:b3:00.0");
  CHECK(gpus[1].mig_uuids ==
        std::vector<std::string>{"MIG-33333333-aaaa-bbbb-cccc-000000000000", "MIG-44444444-aaaa-bbbb-cccc-000000000000"});
  CHECK(gpus_from_nvml("/nonexistent/libnvidia-ml.so.1").empty());
}

TEST_CASE("gpus: the GPU memory holders among pids, with NVML started once for the job", "[gpus]") {
  ::setenv("FAKE_NVML_PIDS_0", "101,202", 1);
  ::setenv("FAKE_NVML_PIDS_1", "202,303", 1);
  void* lib = ::dlopen(FAKE_NVML_LIB, RTLD_NOW | RTLD_LOCAL);  // the same copy the probe loads
  REQUIRE(lib);
  auto inits = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_nvml_inits"));
  REQUIRE(inits);
  const int before = inits();
  {
    GpuMemoryHolders holders(FAKE_NVML_LIB);
    CHECK(holders({}).empty());  // nothing asked: NVML not started
    CHECK(inits() == before);
    CHECK(holders({202, 303, 404}) == std::vector<pid_t>{202, 303});
    ::setenv("FAKE_NVML_PIDS_0", "", 1);
    ::setenv("FAKE_NVML_PIDS_1", "", 1);
    CHECK(holders({202, 303}).empty());  // released: asked again on the same session
    CHECK(inits() == before + 1);
  }
  GpuMemoryHolders missing("/nonexistent/libnvidia-ml.so.1");
  CHECK(missing({1}).empty());
  ::dlclose(lib);
}

TEST_CASE("gpus: NVML that did not start is started again, and a lost GPU's session opened again", "[gpus]") {
  ::setenv("FAKE_NVML_PIDS_0", "7", 1);
  ::unsetenv("FAKE_NVML_PIDS_1");
  void* lib = ::dlopen(FAKE_NVML_LIB, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib);
  auto inits = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_nvml_inits"));
  REQUIRE(inits);
  GpuMemoryHolders holders(FAKE_NVML_LIB);
  ::setenv("FAKE_NVML_INIT_FAILS", "1", 1);
  int n = inits();
  CHECK(holders({7}).empty());
  CHECK(inits() == n + 1);
  ::unsetenv("FAKE_NVML_INIT_FAILS");
  CHECK(holders({7}) == std::vector<pid_t>{7});  // started at this question
  CHECK(inits() == n + 2);
  ::setenv("FAKE_NVML_GPU_LOST", "1", 1);
  n = inits();
  CHECK(holders({7}).empty());  // could not say, even after starting again (once)
  CHECK(inits() == n + 1);
  ::unsetenv("FAKE_NVML_GPU_LOST");
  CHECK(holders({7}) == std::vector<pid_t>{7});
  CHECK(inits() == n + 2);
  ::unsetenv("FAKE_NVML_PIDS_0");
  ::dlclose(lib);
}

TEST_CASE("gpus: the driver's list first, NVML without it or for MIG ids", "[gpus]") {
  FakeRoot f;
  f.gpu("0000:18:00.0", "GPU-aaaa1111-0000-0000-0000-000000000000");
  GpuSources with_proc{f.root + "/proc", FAKE_NVML_LIB, f.root + "/sys"};
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  CHECK(find_visible_gpus(with_proc).size() == 1);  // /proc answers: NVML is not loaded
  GpuSources nvml_only{f.root + "/none", FAKE_NVML_LIB, f.root + "/sys"};
  CHECK(find_visible_gpus(nvml_only).size() == 2);
  ::setenv("CUDA_VISIBLE_DEVICES", "MIG-44444444-aaaa-bbbb-cccc-000000000000", 1);
  auto mig = find_visible_gpus(with_proc);  // resolved through NVML's instances
  REQUIRE(mig.size() == 1);
  CHECK(mig[0].pci_bus_id == "0000:b3:00.0");
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  CHECK(find_visible_gpus(with_proc).empty());
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  GpuSources nothing{f.root + "/none", "/nonexistent/libnvidia-ml.so.1", f.root + "/sys"};
  CHECK(find_visible_gpus(nothing).empty());
}

TEST_CASE("gpus: each visible GPU's NUMA node by its PCI bus id, whatever CUDA numbers it", "[gpus]") {
  SKIP_UNLESS(DDPRUN_FEATURE_HWLOC, "ddprun was built without hwloc (apt-get install libhwloc-dev)");
  FakeRoot f;
  f.file("sys/bus/pci/devices/0000:18:00.0/numa_node", "3\n");
  f.file("sys/bus/pci/devices/0000:2a:00.0/numa_node", "1\n");
  f.file("sys/bus/pci/devices/0000:ab:00.0/numa_node", "-1\n");  // the firmware does not say
  CHECK(pci_numa_node("0000:18:00.0", f.root + "/sys") == 3);
  CHECK(pci_numa_node("0000:ab:00.0", f.root + "/sys") == -1);
  CHECK(pci_numa_node("0000:ff:00.0", f.root + "/sys") == -1);
  CHECK(pci_numa_node("", f.root + "/sys") == -1);
  // 4 NUMA nodes of 8 PUs; CUDA_VISIBLE_DEVICES=1,0,2: local rank 0 is on the second GPU.
  auto topo = Topology::synthetic("pack:2 numa:2 l3:2 core:4 pu:1");
  auto visible = visible_gpus(kFour, "1,0,2", true);
  auto nodes = topo.numa_nodes_of(visible, f.root + "/sys");
  CHECK(nodes == std::vector<int>{1, 3, -1});
  auto plan = plan_bindings(topo, 3, NumaMode::node, nodes);
  CHECK(plan[0].numa_node == 1);
  CHECK(plan[1].numa_node == 3);
  CHECK(plan[2].numa_node == 2);  // unknown: spread as on a CPU-only node (rank 2 of 3 over 4 nodes)
}
