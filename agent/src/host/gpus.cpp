// GPUs from the driver's /proc entries, CUDA_VISIBLE_DEVICES applied as CUDA applies it, NUMA
// nodes from sysfs (ddprun/agent/gpus.hpp). NVML: gpus_nvml.cpp.
#include "ddprun/agent/gpus.hpp"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::agent {
namespace {

bool starts_with_ci(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && lower(s.substr(0, prefix.size())) == lower(prefix);
}

// The GPU an entry names: an index, a (prefix of a) GPU UUID, or a MIG id; -1: none, or not one.
struct Named {
  int gpu = -1;        // index into `all`
  bool unknown_mig = false;  // a MIG id taken on trust (its GPU unknown)
};

int by_uuid_prefix(const std::vector<GpuDevice>& all, const std::string& prefix) {
  int found = -1;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!starts_with_ci(all[i].uuid, prefix)) continue;
    if (found >= 0) return -1;  // ambiguous
    found = static_cast<int>(i);
  }
  return found;
}

Named name_entry(const std::vector<GpuDevice>& all, const std::string& e, bool mig_known) {
  if (!e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    auto i = parse_int(e, 0, static_cast<long long>(all.size()) - 1);
    return Named{i ? static_cast<int>(*i) : -1};
  }
  if (starts_with_ci(e, "GPU-")) return Named{by_uuid_prefix(all, e)};
  if (starts_with_ci(e, "MIG-GPU-")) return Named{by_uuid_prefix(all, e.substr(4, e.find('/') - 4))};
  if (!starts_with_ci(e, "MIG-")) return Named{};
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (const auto& m : all[i].mig_uuids) {
      if (starts_with_ci(m, e)) return Named{static_cast<int>(i)};
    }
  }
  return Named{-1, !mig_known};
}

}  // namespace

GpuDevice parse_gpu_information(const std::string& text) {
  GpuDevice g;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "GPU UUID") g.uuid = value;
    if (key == "Bus Location") g.pci_bus_id = lower(value);
  }
  return g;
}

std::vector<GpuDevice> gpus_from_proc(const std::string& proc_root) {
  std::string dir = proc_root + "/driver/nvidia/gpus";
  std::vector<GpuDevice> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    GpuDevice g = parse_gpu_information(read_file(dir + "/" + e->d_name + "/information"));
    if (g.pci_bus_id.empty()) g.pci_bus_id = lower(e->d_name);  // the directory is named by it
    out.push_back(std::move(g));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.pci_bus_id < b.pci_bus_id; });
  return out;
}

std::vector<VisibleGpu> visible_gpus(const std::vector<GpuDevice>& all, const char* visible, bool mig_known) {
  std::vector<VisibleGpu> out;
  if (!visible) {
    for (const auto& g : all) out.push_back({g.uuid, g.pci_bus_id});
    return out;
  }
  std::vector<std::string> seen;
  for (const auto& raw : split(visible, ',')) {
    std::string e = trim(raw);
    Named n = name_entry(all, e, mig_known);
    bool is_mig = starts_with_ci(e, "MIG-");
    // A GPU named twice (or a MIG id repeated) ends the list, as an unknown entry does.
    std::string key = n.gpu >= 0 && !is_mig ? all[static_cast<std::size_t>(n.gpu)].uuid : lower(e);
    if ((n.gpu < 0 && !n.unknown_mig) || std::find(seen.begin(), seen.end(), key) != seen.end()) break;
    seen.push_back(key);
    out.push_back({e, n.gpu >= 0 ? all[static_cast<std::size_t>(n.gpu)].pci_bus_id : ""});
  }
  return out;
}

std::vector<VisibleGpu> find_visible_gpus(const GpuSources& sources) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  bool needs_mig = visible && lower(visible).find("mig-") != std::string::npos;
  auto all = needs_mig ? std::vector<GpuDevice>{} : gpus_from_proc(sources.proc_root);
  bool mig_known = false;
  if (all.empty()) {
    all = gpus_from_nvml(sources.nvml_library);
    mig_known = !all.empty();
  }
  if (all.empty() && needs_mig) all = gpus_from_proc(sources.proc_root);
  return visible_gpus(all, visible, mig_known);
}

int pci_numa_node(const std::string& bus_id, const std::string& sys_root) {
  if (bus_id.empty()) return -1;
  auto n = parse_int(trim(read_file(sys_root + "/bus/pci/devices/" + bus_id + "/numa_node")), -1, 1 << 20);
  return n ? static_cast<int>(*n) : -1;
}

}  // namespace ddprun::agent
