# Installation, the CMake package, pkg-config, man pages, bash completion and the Debian
# packages (CPack). Included last by the top-level CMakeLists.txt.

include(CMakePackageConfigHelpers)

# ---- programs, libraries, headers ------------------------------------------------------------
# The programs, listed once: installed into bin/ (ddprun-stack and ddprun-full beside ddprun,
# where it finds them: agent/include/ddprun/agent/resources.hpp), and built by the target
# ddprun_programs (with the completion and man pages: all that the component bin installs).
# scripts/build_wheel.sh builds that target and puts every program the install puts in bin/
# into the wheel: a new program goes in this list and nowhere else.
set(DDPRUN_PROGRAMS ddprun ddprun-store)
foreach(_program ddprun-stack ddprun-full)
  if(TARGET ${_program})
    list(APPEND DDPRUN_PROGRAMS ${_program})
  endif()
endforeach()
install(TARGETS ${DDPRUN_PROGRAMS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
add_custom_target(ddprun_programs)
add_dependencies(ddprun_programs ${DDPRUN_PROGRAMS})
install(FILES ${PROJECT_SOURCE_DIR}/agent/python/sitecustomize.py ${PROJECT_SOURCE_DIR}/agent/python/_ddprun_spare.py DESTINATION ${CMAKE_INSTALL_DATADIR}/ddprun/python
  COMPONENT bin)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/wheel/ddprun/__init__.py ${PROJECT_SOURCE_DIR}/packaging/wheel/ddprun/__main__.py
  ${PROJECT_SOURCE_DIR}/packaging/wheel/ddprun/state.py DESTINATION ${CMAKE_INSTALL_DATADIR}/ddprun/python/ddprun COMPONENT bin)
install(TARGETS ddprun_common ddprun_log ddprun_rendezvous ddprun_runtime EXPORT ddprunTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT bin
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(DDPRUN_WITH_NCCL)
  # Loaded by ddprun::runtime from the installed library directory (runtime/src/nccl_loader.cpp).
  install(TARGETS ddprun_runtime_nccl LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT bin)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/common/include/ ${PROJECT_SOURCE_DIR}/rendezvous/include/ ${PROJECT_SOURCE_DIR}/runtime/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

# ---- find_package(ddprun) -----------------------------------------------------------------------
set(DDPRUN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
install(EXPORT ddprunTargets NAMESPACE ddprun:: DESTINATION ${DDPRUN_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddprunConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddprunConfig.cmake INSTALL_DESTINATION ${DDPRUN_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddprunConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)  # 0.x: minor versions may break
install(FILES ${PROJECT_BINARY_DIR}/ddprunConfig.cmake ${PROJECT_BINARY_DIR}/ddprunConfigVersion.cmake
  DESTINATION ${DDPRUN_CMAKE_DIR} COMPONENT dev)

# ---- pkg-config ---------------------------------------------------------------------------------
# No CUDA or NCCL here even with the nccl backend: ddprun::runtime loads its NCCL plugin (the
# one part that links them) at run time, so programs on gloo run where CUDA is not installed.
set(DDPRUN_PC_PRIVATE_LIBS "-lgloo -lcrypto -lz -lpthread -ldl")
if(DDPRUN_WITH_NCCL)
  set(DDPRUN_PC_NCCL_PLUGIN "\${libdir}/${DDPRUN_NCCL_PLUGIN_NAME}")
else()
  set(DDPRUN_PC_NCCL_PLUGIN "")
endif()
# Relocatable: the prefix is found from the .pc file's own place (cmake --install --prefix X).
file(RELATIVE_PATH _pc_up /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
set(DDPRUN_PC_PREFIX "\${pcfiledir}/${_pc_up}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ddprun-runtime.pc.in ${PROJECT_BINARY_DIR}/ddprun-runtime.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ddprun-runtime.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# ---- bash completion, from ddprun's own option table ------------------------------------------
set(_completion ${PROJECT_BINARY_DIR}/completion/ddprun)
add_custom_command(OUTPUT ${_completion}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/completion
  COMMAND sh -c "'$<TARGET_FILE:ddprun>' --completion bash > '${_completion}'"
  DEPENDS ddprun VERBATIM COMMENT "bash completion for ddprun")
add_custom_target(ddprun_completion ALL DEPENDS ${_completion})
add_dependencies(ddprun_programs ddprun_completion)
install(FILES ${_completion} DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions COMPONENT bin)

# ---- man pages, from --help (help2man) ----------------------------------------------------------
find_program(DDPRUN_HELP2MAN help2man)
if(DDPRUN_HELP2MAN)
  set(_man ${PROJECT_BINARY_DIR}/man)
  foreach(prog ddprun ddprun-store)
    if(prog STREQUAL "ddprun")
      set(_name "launch data-parallel training workers, as torchrun does")
    else()
      set(_name "serve a PyTorch-compatible TCPStore")
    endif()
    add_custom_command(OUTPUT ${_man}/${prog}.1
      COMMAND ${CMAKE_COMMAND} -E make_directory ${_man}
      COMMAND ${DDPRUN_HELP2MAN} --no-info --no-discard-stderr --section=1 --name=${_name}
              --output=${_man}/${prog}.1 $<TARGET_FILE:${prog}>
      DEPENDS ${prog} VERBATIM COMMENT "man page for ${prog}")
    list(APPEND _man_pages ${_man}/${prog}.1)
  endforeach()
  add_custom_target(ddprun_man ALL DEPENDS ${_man_pages})
  add_dependencies(ddprun_programs ddprun_man)
  install(FILES ${_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT bin)
else()
  message(STATUS "ddprun: help2man not found, man pages are not built (apt-get install help2man)")
endif()

# ---- Debian packages: ddprun (programs) and libddprun-dev (libraries, headers, CMake package) ---
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VENDOR "ddprun")
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "native launcher for data-parallel training (torchrun's contract)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL bin dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# Stripped programs and libraries, as Debian ships them (ddprun: 4 MB, not 100 MB): CPack moves
# their debug information to ddprun-dbgsym and libddprun-dev-dbgsym (.ddeb), where gdb and
# debuginfod find it by build id, as for Debian's own -dbgsym packages.
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_BIN_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_BIN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_BIN_PACKAGE_SHLIBDEPS ON)  # Depends computed by dpkg-shlibdeps
if(DDPRUN_HWLOC_SONAME)
  # Loaded with dlopen when --numa_binding needs it (without it that option says what to install),
  # so dpkg-shlibdeps does not see it: recommended, as Debian does for such libraries
  # (libhwloc.so.15 -> libhwloc15).
  string(REGEX REPLACE "^lib(.*)\\.so\\.([0-9]+)$" "lib\\1\\2" _hwloc_package ${DDPRUN_HWLOC_SONAME})
  set(CPACK_DEBIAN_BIN_PACKAGE_RECOMMENDS ${_hwloc_package})
endif()
set(CPACK_DEBIAN_BIN_DESCRIPTION "native launcher for data-parallel training
 ddprun starts one training worker per GPU or CPU slot with torchrun's flags and environment,
 hosts a PyTorch-compatible rendezvous store, restarts failed worker groups, and coordinates
 several nodes. Includes ddprun-store, a standalone TCPStore server.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddprun-dev)
set(CPACK_DEBIAN_DEV_DESCRIPTION "ddprun's worker runtime for native trainers (development files)
 Process groups (gloo; nccl when built with CUDA), bucketed gradient all-reduce, the
 rendezvous store client, with a CMake package (find_package(ddprun)) and pkg-config.")
set(_dev_depends "ddprun (= ${PROJECT_VERSION})")
if(NOT BUILD_SHARED_LIBS)
  string(APPEND _dev_depends ", libgloo-dev, libspdlog-dev, libfmt-dev, libssl-dev, zlib1g-dev")
else()
  set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS ON)
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${_dev_depends}")
if(DDPRUN_WITH_NCCL)
  # CUDA and NCCL in /usr/local/cuda come from NVIDIA's installers, not from Debian packages.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${DDPRUN_CUDA_ROOT}/lib64 ${DDPRUN_CUDA_ROOT}/lib)
endif()
include(CPack)
