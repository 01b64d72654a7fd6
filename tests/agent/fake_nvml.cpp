// A stand-in for libnvidia-ml.so.1 (gpus_test.cpp): two GPUs in NVML's order, the second with
// MIG instances in slots 0 and 2, through the entry points ddprun's gpus_nvml.cpp loads. The
// compute processes of GPU i are the pids in $FAKE_NVML_PIDS_<i> (commas between), read at each
// call; fake_nvml_inits() counts nvmlInit_v2 calls; $FAKE_NVML_INIT_FAILS makes nvmlInit_v2
// fail, $FAKE_NVML_GPU_LOST the process lists. It
// follows ddprun's own declaration of the ABI; the real library is checked on a GPU machine
// (scripts/gpu_check_startup.sh).
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

struct Device {
  const char* uuid;
  const char* bus_id;
  int mig_of;  // -1: a GPU; else the GPU whose MIG instance this is
};

Device g_devices[] = {
    {"GPU-11111111-aaaa-bbbb-cccc-000000000000", "00000000:18:00.0", -1},
    {"GPU-22222222-aaaa-bbbb-cccc-000000000000", "00000000:B3:00.0", -1},
    {"MIG-33333333-aaaa-bbbb-cccc-000000000000", "", 1},
    {"MIG-44444444-aaaa-bbbb-cccc-000000000000", "", 1},
};
bool g_initialised = false;
int g_inits = 0;  // nvmlInit_v2 calls (fake_nvml_inits)

int copy(char* out, unsigned size, const char* text) {
  if (std::strlen(text) + 1 > size) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  std::strcpy(out, text);
  return 0;
}

}  // namespace

extern "C" {
int nvmlInit_v2() {
  ++g_inits;
  if (std::getenv("FAKE_NVML_INIT_FAILS")) return 9;  // NVML_ERROR_DRIVER_NOT_LOADED
  g_initialised = true;
  return 0;
}
int fake_nvml_inits() { return g_inits; }
int nvmlShutdown() {
  g_initialised = false;
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned* n) {
  if (!g_initialised) return 1;  // NVML_ERROR_UNINITIALIZED
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** dev) {
  if (i >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *dev = &g_devices[i];
  return 0;
}
int nvmlDeviceGetUUID(void* dev, char* out, unsigned size) { return copy(out, size, static_cast<Device*>(dev)->uuid); }
int nvmlDeviceGetPciInfo_v3(void* dev, PciInfo* pci) {
  std::memset(pci, 0, sizeof(*pci));
  return copy(pci->bus_id, sizeof(pci->bus_id), static_cast<Device*>(dev)->bus_id);
}
int nvmlDeviceGetMaxMigDeviceCount(void* dev, unsigned* n) {
  *n = static_cast<Device*>(dev) == &g_devices[1] ? 3 : 0;
  return 0;
}
int nvmlDeviceGetMigDeviceHandleByIndex(void* dev, unsigned i, void** mig) {
  if (static_cast<Device*>(dev) != &g_devices[1] || i == 1 || i > 2) return 6;  // NVML_ERROR_NOT_FOUND
  *mig = &g_devices[i == 0 ? 2 : 3];
  return 0;
}
struct ProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};
int nvmlDeviceGetComputeRunningProcesses_v3(void* dev, unsigned* count, ProcessInfo* out) {
  if (!g_initialised) return 1;
  if (std::getenv("FAKE_NVML_GPU_LOST")) return 15;  // NVML_ERROR_GPU_IS_LOST
  const int index = static_cast<Device*>(dev) == &g_devices[0] ? 0 : 1;
  char name[32];
  std::snprintf(name, sizeof(name), "FAKE_NVML_PIDS_%d", index);
  const char* list = std::getenv(name);
  unsigned n = 0;
  for (const char* p = list; p && *p;) {
    char* end = nullptr;
    long pid = std::strtol(p, &end, 10);
    if (end == p) break;
    if (n < *count) out[n] = ProcessInfo{static_cast<unsigned>(pid), 1ull << 20, 0, 0};
    ++n;
    p = *end == ',' ? end + 1 : end;
  }
  const bool fits = n <= *count;
  *count = n;
  return fits ? 0 : 7;  // NVML_ERROR_INSUFFICIENT_SIZE
}
}
