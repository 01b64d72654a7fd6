// GPUs through NVML, loaded at run time (ddprun links nothing of the driver): for the GPUs' list
// the library is opened, asked, shut down and closed again; for the GPU memory a failed group's
// workers still hold, it stays open from the job's first failure to its end.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "ddprun/agent/gpus.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::agent {
namespace {

// The part of NVML's ABI used here (nvml.h, stable since NVML 10): return codes, an opaque
// device handle, nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kUuidSize = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];  // "00000000:18:00.0"
};

// nvmlProcessInfo_t as nvmlDeviceGetComputeRunningProcesses_v3 fills it.
struct NvmlProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr nvmlReturn_t kNvmlNotSupported = 3;

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*pci)(nvmlDevice_t, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*max_mig)(nvmlDevice_t, unsigned*) = nullptr;        // optional (MIG: NVML 11+)
  nvmlReturn_t (*mig_by_index)(nvmlDevice_t, unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*compute_procs)(nvmlDevice_t, unsigned*, NvmlProcessInfo*) = nullptr;  // optional (NVML 11+)

  template <typename F>
  void bind(F& fn, const char* name) {
    fn = reinterpret_cast<F>(::dlsym(lib, name));
  }
  bool load(const std::string& library) {
    lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    bind(init, "nvmlInit_v2");
    bind(shutdown, "nvmlShutdown");
    bind(count, "nvmlDeviceGetCount_v2");
    bind(by_index, "nvmlDeviceGetHandleByIndex_v2");
    bind(uuid, "nvmlDeviceGetUUID");
    bind(pci, "nvmlDeviceGetPciInfo_v3");
    bind(max_mig, "nvmlDeviceGetMaxMigDeviceCount");
    bind(mig_by_index, "nvmlDeviceGetMigDeviceHandleByIndex");
    bind(compute_procs, "nvmlDeviceGetComputeRunningProcesses_v3");
    return init && shutdown && count && by_index && uuid && pci;
  }
  ~Nvml() {
    if (lib) ::dlclose(lib);
  }
};

// "00000000:18:00.0" -> "0000:18:00.0" (sysfs's spelling: 4-digit domain, lower case).
std::string sysfs_bus_id(const char* nvml_bus_id) {
  std::string s = lower(nvml_bus_id);
  auto colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
  return s;
}

std::vector<std::string> mig_instances(Nvml& nvml, nvmlDevice_t gpu) {
  std::vector<std::string> out;
  unsigned max = 0;
  if (!nvml.max_mig || !nvml.mig_by_index || nvml.max_mig(gpu, &max) != kNvmlSuccess) return out;
  for (unsigned i = 0; i < max; ++i) {
    nvmlDevice_t mig = nullptr;
    char id[kUuidSize] = {};
    if (nvml.mig_by_index(gpu, i, &mig) == kNvmlSuccess && nvml.uuid(mig, id, sizeof(id)) == kNvmlSuccess) {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace

std::vector<GpuDevice> gpus_from_nvml(const std::string& library) {
  std::vector<GpuDevice> out;
  Nvml nvml;
  if (!nvml.load(library) || nvml.init() != kNvmlSuccess) return out;
  unsigned n = 0;
  if (nvml.count(&n) == kNvmlSuccess) {
    for (unsigned i = 0; i < n; ++i) {
      nvmlDevice_t dev = nullptr;
      if (nvml.by_index(i, &dev) != kNvmlSuccess) continue;
      GpuDevice g;
      char id[kUuidSize] = {};
      if (nvml.uuid(dev, id, sizeof(id)) == kNvmlSuccess) g.uuid = id;
      NvmlPciInfo pci{};
      if (nvml.pci(dev, &pci) == kNvmlSuccess) g.pci_bus_id = sysfs_bus_id(pci.bus_id);
      g.mig_uuids = mig_instances(nvml, dev);
      out.push_back(std::move(g));
    }
  }
  nvml.shutdown();
  return out;
}

// NVML started, and its GPUs' handles (valid until nvmlShutdown, or until a GPU is lost or reset:
// an error then, and the session is opened again).
struct GpuMemoryHolders::Session {
  Nvml nvml;
  bool started = false;
  std::vector<nvmlDevice_t> gpus;

  enum class Opened { yes, no_library, failed };
  Opened open(const std::string& library) {
    if (!nvml.load(library) || !nvml.compute_procs) return Opened::no_library;
    if (nvml.init() != kNvmlSuccess) return Opened::failed;
    started = true;
    unsigned n = 0;
    if (nvml.count(&n) != kNvmlSuccess) return Opened::failed;
    for (unsigned i = 0; i < n; ++i) {
      nvmlDevice_t dev = nullptr;
      if (nvml.by_index(i, &dev) != kNvmlSuccess) return Opened::failed;
      gpus.push_back(dev);
    }
    return gpus.empty() ? Opened::failed : Opened::yes;
  }
  ~Session() {
    if (started) nvml.shutdown();  // before ~Nvml unloads the library
  }

  // The processes using GPU `dev` (compute); false when NVML could not say.
  bool compute_processes(nvmlDevice_t dev, std::vector<NvmlProcessInfo>& procs) {
    procs.resize(64);
    unsigned count = static_cast<unsigned>(procs.size());
    nvmlReturn_t r = nvml.compute_procs(dev, &count, procs.data());
    if (r == kNvmlInsufficientSize && count < 65536) {
      procs.resize(count + 16);  // it asks for room: more may have started meanwhile
      count = static_cast<unsigned>(procs.size());
      r = nvml.compute_procs(dev, &count, procs.data());
    }
    procs.resize(r == kNvmlSuccess ? count : 0);
    return r == kNvmlSuccess || r == kNvmlNotSupported;
  }

  // Of `pids`, those a GPU lists; false when a GPU could not say.
  bool holders(const std::vector<pid_t>& pids, std::vector<pid_t>& held) {
    bool answered = true;
    std::vector<NvmlProcessInfo> procs;
    for (nvmlDevice_t dev : gpus) {
      answered = compute_processes(dev, procs) && answered;
      for (const auto& p : procs) {
        auto pid = static_cast<pid_t>(p.pid);
        if (std::find(pids.begin(), pids.end(), pid) != pids.end() && std::find(held.begin(), held.end(), pid) == held.end()) {
          held.push_back(pid);
        }
      }
    }
    return answered;
  }
};

GpuMemoryHolders::GpuMemoryHolders(std::string library) : library_(std::move(library)) {}
GpuMemoryHolders::~GpuMemoryHolders() = default;

std::vector<pid_t> GpuMemoryHolders::operator()(const std::vector<pid_t>& pids) {
  std::vector<pid_t> held;
  if (pids.empty() || no_library_) return held;
  // A session that cannot answer (a GPU lost or reset since it opened: stale handles) is opened
  // again, once; one that failed to open is tried again at the next question.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!session_) {
      auto s = std::make_unique<Session>();
      auto opened = s->open(library_);
      no_library_ = opened == Session::Opened::no_library;
      if (opened != Session::Opened::yes) return held;
      session_ = std::move(s);
    }
    held.clear();
    if (session_->holders(pids, held)) return held;
    spdlog::debug("ddprun: NVML could not list a GPU's processes; starting it again");
    session_.reset();
  }
  return held;
}

}  // namespace ddprun::agent
