#pragma once
// The machine's NVIDIA GPUs without CUDA: the driver's /proc/driver/nvidia/gpus/*/information,
// else NVML (libnvidia-ml.so.1, loaded at run time). Neither creates a CUDA context, so counting
// GPUs (--nproc_per_node=gpu) costs a few file reads, keeps no library loaded and cannot hang in
// cuInit on a wedged GPU. CUDA_VISIBLE_DEVICES is applied as CUDA does (indexes, GPU UUIDs, MIG
// ids; an empty value means none), and each visible GPU is known by its PCI bus id, which says
// where it sits (its NUMA node), whatever number CUDA gives it.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace ddprun::agent {

struct GpuDevice {
  std::string uuid;        // "GPU-5a3c9d2e-...", as nvidia-smi -L shows it
  std::string pci_bus_id;  // "0000:18:00.0": lower case, 4-digit domain (as /sys/bus/pci/devices names it)
  std::vector<std::string> mig_uuids;  // its MIG instances ("MIG-..."): from NVML only
};

// Where the GPUs are read from (tests point these at fakes).
struct GpuSources {
  std::string proc_root = "/proc";
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string sys_root = "/sys";
};

// One GPU's /proc/driver/nvidia/gpus/BUS/information ("GPU UUID:", "Bus Location:" lines).
GpuDevice parse_gpu_information(const std::string& text);
// Every GPU the driver lists under proc_root, in PCI bus order; empty without the driver.
std::vector<GpuDevice> gpus_from_proc(const std::string& proc_root);
// Every GPU NVML lists (in its order, PCI bus order), with MIG instances; empty when NVML
// cannot be loaded or initialised. Loads and unloads the library; never throws.
std::vector<GpuDevice> gpus_from_nvml(const std::string& library);

// A GPU a process sees: the CUDA_VISIBLE_DEVICES entry (or the UUID when unset) and the PCI bus
// id of the GPU it is on ("" when unknown: a MIG id NVML could not resolve).
struct VisibleGpu {
  std::string id;
  std::string pci_bus_id;
};

// What CUDA_VISIBLE_DEVICES (`visible`; nullptr: unset, every GPU) leaves of `all`: entries
// separated by commas, each an index (into the GPUs in PCI bus order: CUDA's own order with
// CUDA_DEVICE_ORDER=PCI_BUS_ID, and on nodes of identical GPUs), a GPU UUID or a unique prefix
// of one ("GPU-5a3c"), or a MIG id ("MIG-<uuid>", or "MIG-GPU-<uuid>/<gi>/<ci>"). As in CUDA,
// the list ends at the first entry that names no device or one already named ("" and "-1":
// none). `mig_known`: whether `all` lists MIG instances (else a MIG id is taken on trust).
std::vector<VisibleGpu> visible_gpus(const std::vector<GpuDevice>& all, const char* visible, bool mig_known);

// The GPUs this process's CUDA_VISIBLE_DEVICES leaves visible: the driver's list, NVML when the
// driver's /proc lists nothing or a MIG id needs resolving. Never throws.
std::vector<VisibleGpu> find_visible_gpus(const GpuSources& sources = {});

// Of the pids asked about, those a GPU still holds memory for (NVML's compute processes, every
// GPU); empty when none is, or where NVML cannot be loaded. NVML is opened at the first question
// and kept open until this is destroyed: a job asks at the end of each failed group, and NVML's
// own start (loading the library and attaching to the driver: 8-12 ms on an H200) is paid once
// per job, not at every restart. For one thread at a time (the agent's loop); never throws.
class GpuMemoryHolders {
 public:
  explicit GpuMemoryHolders(std::string library = "libnvidia-ml.so.1");
  ~GpuMemoryHolders();  // shuts NVML down and unloads it, where it was opened
  GpuMemoryHolders(const GpuMemoryHolders&) = delete;
  GpuMemoryHolders& operator=(const GpuMemoryHolders&) = delete;
  // Where the library cannot be loaded, empty (and not loaded again);
  // where NVML does not start, empty, and started again at the next question; a session that
  // cannot list a GPU's processes (a GPU lost or reset since) is started again once.
  std::vector<pid_t> operator()(const std::vector<pid_t>& pids);

 private:
  struct Session;
  std::string library_;
  std::unique_ptr<Session> session_;
  bool no_library_ = false;
};

// The NUMA node (OS index) of PCI device `bus_id` from sysfs; -1 when unknown.
int pci_numa_node(const std::string& bus_id, const std::string& sys_root = "/sys");

}  // namespace ddprun::agent
