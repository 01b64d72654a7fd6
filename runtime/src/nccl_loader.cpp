// The nccl backend's CUDA and NCCL calls live in a plugin, libddprun-runtime-nccl.so, loaded
// here on first use: a program on the gloo backend never loads (nor needs installed) CUDA or
// NCCL, even from a build of ddprun that has the nccl backend.
//
// Where the plugin is looked for, first found wins: $DDPRUN_NCCL_BACKEND (a path); beside the
// library or program that holds this code; the installed library directory; then the dynamic
// loader's own search (LD_LIBRARY_PATH, the cache).

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "nccl_api.hpp"
#include "nccl_group.hpp"
#include "nccl_unique_id.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime {
namespace nccl {
namespace {

using Entry = Api* (*)();

struct Loaded {
  Entry entry = nullptr;
  std::string error;  // what every attempt said, when none loaded
};

std::string directory_of_this_code() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&directory_of_this_code), &info) == 0 || !info.dli_fname) return {};
  std::string f = info.dli_fname;
  if (f.empty() || f[0] != '/') return {};  // a relative name would make the current directory a search path
  auto slash = f.rfind('/');
  return slash == std::string::npos ? std::string() : f.substr(0, slash);
}

Loaded load() {
  std::vector<std::string> candidates;
  if (const char* e = std::getenv("DDPRUN_NCCL_BACKEND"); e && *e) candidates.push_back(e);
  if (auto dir = directory_of_this_code(); !dir.empty()) candidates.push_back(dir + "/" + DDPRUN_NCCL_PLUGIN_NAME);
  candidates.push_back(std::string(DDPRUN_INSTALL_LIBDIR) + "/" + DDPRUN_NCCL_PLUGIN_NAME);
  candidates.push_back(DDPRUN_NCCL_PLUGIN_NAME);
  Loaded out;
  for (const auto& c : candidates) {
    void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = ::dlerror();
      out.error += "\n  " + c + ": " + (why ? why : "not loadable");
      continue;
    }
    if (auto* f = reinterpret_cast<Entry>(::dlsym(h, "ddprun_runtime_nccl_api_v1"))) {
      out.entry = f;
      out.error.clear();
      return out;
    }
    out.error += "\n  " + c + ": no ddprun_runtime_nccl_api_v1 (not ddprun's NCCL plugin, or another version)";
    ::dlclose(h);
  }
  return out;
}

const Loaded& loaded() {
  static std::once_flag once;
  static Loaded l;
  std::call_once(once, [] { l = load(); });
  return l;
}

}  // namespace

std::shared_ptr<Api> make_cuda_api() {
  const auto& l = loaded();
  if (!l.entry) {
    throw UsageError(std::string("nccl backend: cannot load ") + DDPRUN_NCCL_PLUGIN_NAME +
                     ", which holds ddprun's calls to CUDA and NCCL (install ddprun's NCCL plugin and CUDA/NCCL, set "
                     "DDPRUN_NCCL_BACKEND to its path, or use \"gloo\"); tried:" + l.error);
  }
  return std::shared_ptr<Api>(l.entry());
}

bool plugin_loadable() { return loaded().entry != nullptr; }

}  // namespace nccl

std::string exchange_nccl_unique_id(rendezvous::Store& store, int rank) {
  auto api = nccl::make_cuda_api();
  return nccl::exchange_unique_id(*api, store, rank);
}

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, int local_rank,
                                                      int local_size) {
  return nccl::make_process_group(nccl::make_cuda_api(), std::move(store), rank, size, options,
                                  nccl::Placement{local_rank, local_size});
}

}  // namespace ddprun::runtime
