# halo's CMake package (installed by `cargo xtask capi-install --prefix DIR` as
# DIR/lib/cmake/halo/haloConfig.cmake). Use it with
#
#   find_package(halo CONFIG REQUIRED)   # -DCMAKE_PREFIX_PATH=DIR (or -Dhalo_DIR=DIR/lib/cmake/halo)
#   target_link_libraries(app PRIVATE halo::halo)
#
# halo::halo is the shared library DIR/lib/libhalo.so with the header DIR/include/halo.h;
# halo::halo_static the static library DIR/lib/libhalo.a with the system libraries it needs. The
# install is relocatable: every path is found from this file's own folder.

get_filename_component(_halo_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

foreach(_halo_file "${_halo_prefix}/lib/libhalo.so" "${_halo_prefix}/include/halo.h")
  if(NOT EXISTS "${_halo_file}")
    set(halo_FOUND FALSE)
    set(halo_NOT_FOUND_MESSAGE "halo's install in ${_halo_prefix} is incomplete: ${_halo_file} is missing (reinstall with `cargo xtask capi-install --prefix ${_halo_prefix}`)")
    return()
  endif()
endforeach()

if(NOT TARGET halo::halo)
  add_library(halo::halo SHARED IMPORTED)
  set_target_properties(halo::halo PROPERTIES
    IMPORTED_LOCATION "${_halo_prefix}/lib/libhalo.so"
    IMPORTED_SONAME "libhalo.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_halo_prefix}/include")
endif()

if(NOT TARGET halo::halo_static AND EXISTS "${_halo_prefix}/lib/libhalo.a")
  add_library(halo::halo_static STATIC IMPORTED)
  # What the Rust standard library in libhalo.a links against (rustc --print native-static-libs).
  set_target_properties(halo::halo_static PROPERTIES
    IMPORTED_LOCATION "${_halo_prefix}/lib/libhalo.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_halo_prefix}/include"
    INTERFACE_LINK_LIBRARIES "dl;gcc_s;util;rt;pthread;m")
endif()

set(halo_INCLUDE_DIR "${_halo_prefix}/include")
set(halo_LIBRARY_DIR "${_halo_prefix}/lib")
unset(_halo_prefix)
unset(_halo_file)
