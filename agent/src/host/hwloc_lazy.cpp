#include "host/hwloc_lazy.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "ddprun/common/error.hpp"

// The library's file name, as the build found it (agent/CMakeLists.txt), and its path there.
#ifndef DDPRUN_HWLOC_SONAME
#define DDPRUN_HWLOC_SONAME "libhwloc.so.15"
#endif

namespace ddprun::agent {
namespace {

// X(name): one entry per renamed function. `#name` is not macro-expanded: dlsym looks up
// hwloc's own name, while `name` elsewhere is the renamed one.
#define DDPRUN_HWLOC_FUNCTIONS(X)                                                                   \
  X(hwloc_bitmap_first) X(hwloc_bitmap_isincluded) X(hwloc_bitmap_iszero) X(hwloc_bitmap_next)      \
  X(hwloc_bitmap_weight) X(hwloc_get_nbobjs_by_depth) X(hwloc_get_obj_by_depth) X(hwloc_get_type_depth) \
  X(hwloc_topology_destroy) X(hwloc_topology_init) X(hwloc_topology_load) X(hwloc_topology_set_synthetic)

struct Hwloc {
#define DDPRUN_HWLOC_FIELD(name) decltype(&::name) name = nullptr;
  DDPRUN_HWLOC_FUNCTIONS(DDPRUN_HWLOC_FIELD)
#undef DDPRUN_HWLOC_FIELD
  std::string error;  // why it could not be loaded; empty when it was
};

Hwloc open_hwloc() {
  Hwloc h;
  void* lib = ::dlopen(DDPRUN_HWLOC_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef DDPRUN_HWLOC_PATH
  if (!lib) lib = ::dlopen(DDPRUN_HWLOC_PATH, RTLD_NOW | RTLD_LOCAL);  // built against one outside the search path
#endif
  if (!lib) {
    const char* why = ::dlerror();
    h.error = std::string("cannot load ") + DDPRUN_HWLOC_SONAME + " (" + (why ? why : "unknown error") +
              "): install hwloc's library (apt-get install libhwloc15)";
    return h;
  }
#define DDPRUN_HWLOC_LOAD(name)                                                                   \
  h.name = reinterpret_cast<decltype(h.name)>(::dlsym(lib, #name));                               \
  if (!h.name) h.error = std::string(DDPRUN_HWLOC_SONAME) + " has no " #name ": not the hwloc 2 ddprun was built for";
  DDPRUN_HWLOC_FUNCTIONS(DDPRUN_HWLOC_LOAD)
#undef DDPRUN_HWLOC_LOAD
  return h;
}

const Hwloc& hwloc() {
  static const Hwloc h = open_hwloc();
  return h;
}

// For the forwarding functions below: load_hwloc() has succeeded before any of them is called.
const Hwloc& loaded() {
  const Hwloc& h = hwloc();
  if (!h.error.empty()) std::abort();
  return h;
}

}  // namespace

void load_hwloc() {
  if (!hwloc().error.empty()) throw Error("hwloc: " + hwloc().error);
}

}  // namespace ddprun::agent

using ddprun::agent::loaded;

// hwloc.h declares these (renamed) with C linkage.
int hwloc_bitmap_first(hwloc_const_bitmap_t b) { return loaded().hwloc_bitmap_first(b); }
int hwloc_bitmap_isincluded(hwloc_const_bitmap_t sub, hwloc_const_bitmap_t super) {
  return loaded().hwloc_bitmap_isincluded(sub, super);
}
int hwloc_bitmap_iszero(hwloc_const_bitmap_t b) { return loaded().hwloc_bitmap_iszero(b); }
int hwloc_bitmap_next(hwloc_const_bitmap_t b, int prev) { return loaded().hwloc_bitmap_next(b, prev); }
int hwloc_bitmap_weight(hwloc_const_bitmap_t b) { return loaded().hwloc_bitmap_weight(b); }
unsigned hwloc_get_nbobjs_by_depth(hwloc_topology_t t, int depth) { return loaded().hwloc_get_nbobjs_by_depth(t, depth); }
hwloc_obj_t hwloc_get_obj_by_depth(hwloc_topology_t t, int depth, unsigned idx) {
  return loaded().hwloc_get_obj_by_depth(t, depth, idx);
}
int hwloc_get_type_depth(hwloc_topology_t t, hwloc_obj_type_t type) { return loaded().hwloc_get_type_depth(t, type); }
void hwloc_topology_destroy(hwloc_topology_t t) { loaded().hwloc_topology_destroy(t); }
int hwloc_topology_init(hwloc_topology_t* t) { return loaded().hwloc_topology_init(t); }
int hwloc_topology_load(hwloc_topology_t t) { return loaded().hwloc_topology_load(t); }
int hwloc_topology_set_synthetic(hwloc_topology_t t, const char* description) {
  return loaded().hwloc_topology_set_synthetic(t, description);
}
