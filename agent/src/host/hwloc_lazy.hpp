#pragma once
// hwloc, loaded at its first use (--numa_binding) instead of at every start of ddprun: libhwloc
// and the udev library it needs cost 4% of a one-worker launch that binds nothing (README:
// Start-up cost). Include this instead of <hwloc.h>. The hwloc functions ddprun calls, and those
// that hwloc.h's inline helpers call, are renamed before hwloc.h is read; the renamed functions
// (hwloc_lazy.cpp) load the library once and forward to it. A function missing from the list
// below fails the link (ddprun does not link libhwloc): add it here and in hwloc_lazy.cpp.

#define hwloc_bitmap_first ddprun_lazy_hwloc_bitmap_first
#define hwloc_bitmap_isincluded ddprun_lazy_hwloc_bitmap_isincluded
#define hwloc_bitmap_iszero ddprun_lazy_hwloc_bitmap_iszero
#define hwloc_bitmap_next ddprun_lazy_hwloc_bitmap_next
#define hwloc_bitmap_weight ddprun_lazy_hwloc_bitmap_weight
#define hwloc_get_nbobjs_by_depth ddprun_lazy_hwloc_get_nbobjs_by_depth
#define hwloc_get_obj_by_depth ddprun_lazy_hwloc_get_obj_by_depth
#define hwloc_get_type_depth ddprun_lazy_hwloc_get_type_depth
#define hwloc_topology_destroy ddprun_lazy_hwloc_topology_destroy
#define hwloc_topology_init ddprun_lazy_hwloc_topology_init
#define hwloc_topology_load ddprun_lazy_hwloc_topology_load
#define hwloc_topology_set_synthetic ddprun_lazy_hwloc_topology_set_synthetic

#include <hwloc.h>

namespace ddprun::agent {

// Loads hwloc (once). Throws Error naming the library and the package to install when it cannot
// be loaded; the functions above may be called after it returned.
void load_hwloc();

}  // namespace ddprun::agent
