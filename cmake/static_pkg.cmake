# ddprun_link_pkg_static(TARGET PREFIX): links TARGET with the static archives of the pkg-config
# module found by pkg_check_modules(PREFIX ...) and of what it needs (pkg-config --static: for
# libdw, libelf, zlib, liblzma, libbz2), and with the C++ runtime statically, so that the
# program loads nothing beyond glibc: what a wheel's platform tag allows (scripts/build_wheel.sh).
# Where an archive is missing it links the shared libraries, as before, and says so.
function(ddprun_link_pkg_static target prefix)
  set(archives)
  foreach(name IN LISTS ${prefix}_STATIC_LIBRARIES)
    if(name MATCHES "^(pthread|dl|rt|m|c)$")  # glibc's own: always shared
      continue()
    endif()
    find_library(_archive_${name} NAMES lib${name}.a HINTS ${${prefix}_STATIC_LIBRARY_DIRS})
    if(NOT _archive_${name})
      message(STATUS "ddprun: lib${name}.a not found: ${target} loads ${prefix} as a shared library")
      target_link_libraries(${target} PRIVATE PkgConfig::${prefix})
      return()
    endif()
    list(APPEND archives ${_archive_${name}})
  endforeach()
  target_include_directories(${target} PRIVATE ${${prefix}_INCLUDE_DIRS})
  # Each archive twice: pkg-config's order (-ldw -lbz2 -lelf -lz -llzma) is not the order of
  # their references, which a static link needs.
  target_link_libraries(${target} PRIVATE ${archives} ${archives} Threads::Threads ${CMAKE_DL_LIBS})
  target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc)
endfunction()
