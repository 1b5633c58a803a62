# Precompiled headers shared across targets (VC_PCH, on by default).
#
# Why: most of a translation unit's compile time here is spent parsing the
# same headers (the standard library, Abseil's Status and strings, gtest and
# gmock): 2-3 s of a typical 3-5 s object, in each of the ~230 objects of a
# build, and the per-commit CI builds the tree twice. A precompiled header is
# parsed once per family of targets compiled with the same options and
# reused by every target of that family (REUSE_FROM).
#
# How: vc_use_precompiled_headers(), called once after every target exists,
# groups the C++ targets by their compile options (the directory's options:
# the tests' VC_TEST_CXX_OPTIONS, the fuzz targets' coverage flags...) and by
# whether they link gtest, makes one carrier target per group of at least
# VC_PCH_MIN_SOURCES C++ files, and points the group at it. Targets whose
# sources carry their own flags (the SIMD kernels' -mavx2/-mavx512f), with
# non-C++ sources (CUDA) or with a precompiled header of their own are left
# alone. A target that uses the precompiled header gets the Status
# [[nodiscard]] declarations from it (the header is its first include), so
# the top CMakeLists.txt force-includes status_nodiscard.h only where the
# VC_PCH_FAMILY target property is unset.
#
# Flags must match between a precompiled header and its users: gcc ignores a
# header built with other macros or optimisation levels (-Winvalid-pch, an
# error with VC_WERROR) and clang refuses it outright, which is why the
# families are keyed by options and why -pthread is a global compile option.
# A header missing an #include can compile here and not elsewhere; the
# clang-tidy lint (deploy/scripts/lint.py) parses every changed file without
# the precompiled header, which catches that.

option(VC_PCH "Share precompiled headers across targets with the same compile options" ON)
# Building a precompiled header costs about as much as compiling 3-4 files
# (its gain per file is 1-2 s), so small groups compile without one.
set(VC_PCH_MIN_SOURCES 12 CACHE STRING "Fewest C++ files a group of targets needs to get a precompiled header")

# What every family precompiles: the headers most of the tree includes.
set(VC_PCH_HEADERS
  "${CMAKE_SOURCE_DIR}/common/base/status_nodiscard.h"
  <algorithm> <atomic> <chrono> <cmath> <cstdint> <cstdio> <cstdlib> <cstring>
  <functional> <map> <memory> <mutex> <optional> <string> <string_view>
  <thread> <utility> <vector>
  <absl/status/status.h> <absl/status/statusor.h> <absl/strings/str_cat.h>)
# ... and what the test families add.
set(VC_PCH_TEST_HEADERS <gtest/gtest.h> <gmock/gmock.h>)

# vc_all_targets(dir out): every target defined in dir and below.
function(vc_all_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    vc_all_targets("${sub}" sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# vc_pch_eligible(target out): the number of C++ files of the target if it
# can share a precompiled header, else 0.
function(vc_pch_eligible target out)
  set(${out} 0 PARENT_SCOPE)
  get_target_property(type ${target} TYPE)
  if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
    return()
  endif()
  get_target_property(own_pch ${target} PRECOMPILE_HEADERS)
  get_target_property(reused ${target} PRECOMPILE_HEADERS_REUSE_FROM)
  if(own_pch OR reused)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(cxx_sources 0)
  foreach(source IN LISTS sources)
    if(source MATCHES "\\$<")  # generator expressions: cannot inspect, skip the target
      return()
    endif()
    if(NOT source MATCHES "\\.(cc|cpp|cxx)$")
      if(source MATCHES "\\.(cu|c)$")
        return()
      endif()
      continue()
    endif()
    # Relative paths are read against the calling directory: anchor them.
    cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY "${source_dir}")
    foreach(property COMPILE_OPTIONS COMPILE_FLAGS)
      get_source_file_property(value "${source}" TARGET_DIRECTORY ${target} ${property})
      if(value)
        return()
      endif()
    endforeach()
    math(EXPR cxx_sources "${cxx_sources} + 1")
  endforeach()
  set(${out} ${cxx_sources} PARENT_SCOPE)
endfunction()

function(vc_use_precompiled_headers)
  if(NOT VC_PCH)
    return()
  endif()
  vc_all_targets("${CMAKE_SOURCE_DIR}" targets)
  set(keys "")
  foreach(target IN LISTS targets)
    vc_pch_eligible(${target} sources)
    if(sources EQUAL 0)
      continue()
    endif()
    get_target_property(options ${target} COMPILE_OPTIONS)
    if(NOT options)
      set(options "")
    endif()
    get_target_property(libs ${target} LINK_LIBRARIES)
    set(gtest FALSE)
    if(libs AND "GTest::gtest" IN_LIST libs)
      set(gtest TRUE)
    endif()
    string(SHA1 key "${options}|${gtest}")
    string(SUBSTRING "${key}" 0 10 key)
    if(NOT key IN_LIST keys)
      list(APPEND keys ${key})
      set(members_${key} "")
      set(sources_${key} 0)
      set(options_${key} "${options}")
      set(gtest_${key} ${gtest})
    endif()
    list(APPEND members_${key} ${target})
    math(EXPR sources_${key} "${sources_${key}} + ${sources}")
  endforeach()

  set(empty_source "${CMAKE_BINARY_DIR}/pch/empty.cc")
  file(WRITE "${empty_source}" "// The carrier of a shared precompiled header (cmake/precompiled_headers.cmake).\n")
  set(families 0)
  foreach(key IN LISTS keys)
    if(sources_${key} LESS VC_PCH_MIN_SOURCES)
      continue()
    endif()
    # gcc (12) forgets, for code it read from a precompiled header, that the
    # code came from a system header: its optimisers' flow warnings about
    # libstdc++'s inlined internals (-Warray-bounds, -Wstringop-overflow,
    # -Wstringop-overread on a moved std::string), silenced everywhere else,
    # then fail optimised files under VC_WERROR (three in this tree). Those
    # warnings need the optimisers, so gcc shares headers only among files
    # compiled at -O0 (the tests, in the CI builds); clang has no such
    # problem and shares them everywhere.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT options_${key} MATCHES "(^|;|:)-O0(>|;|$)")
      continue()
    endif()
    set(carrier vc_pch_${key})
    add_library(${carrier} STATIC EXCLUDE_FROM_ALL "${empty_source}")
    set_target_properties(${carrier} PROPERTIES COMPILE_OPTIONS "${options_${key}}"
                                                VC_PCH_FAMILY ${key})
    set(headers ${VC_PCH_HEADERS})
    target_link_libraries(${carrier} PRIVATE absl::status absl::statusor absl::strings)
    if(gtest_${key})
      find_package(GTest REQUIRED)  # tests/ found it there; imported targets are per directory
      list(APPEND headers ${VC_PCH_TEST_HEADERS})
      target_link_libraries(${carrier} PRIVATE GTest::gtest GTest::gmock)
    endif()
    target_precompile_headers(${carrier} PRIVATE ${headers})
    foreach(target IN LISTS members_${key})
      target_precompile_headers(${target} REUSE_FROM ${carrier})
      set_target_properties(${target} PROPERTIES VC_PCH_FAMILY ${key})
    endforeach()
    message(VERBOSE "VC_PCH family ${key} (${sources_${key}} files): ${members_${key}}")
    math(EXPR families "${families} + 1")
  endforeach()
  message(STATUS "VeriCache: ${families} precompiled-header families (VC_PCH)")
endfunction()
