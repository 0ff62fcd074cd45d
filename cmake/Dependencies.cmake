# Debian packages (installed by scripts/install-deps.sh). Static archives are used when
# PATCHGEN_STATIC is on; CMake's find_library picks .a through CMAKE_FIND_LIBRARY_SUFFIXES.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

# tree-sitter runtime 0.20.7: no CMake config; its .pc reports a wrong version, so only the paths are used.
find_path(TREE_SITTER_INCLUDE_DIR tree_sitter/api.h REQUIRED)
find_library(TREE_SITTER_LIBRARY NAMES tree-sitter REQUIRED)
add_library(tree_sitter_runtime INTERFACE)
target_include_directories(tree_sitter_runtime SYSTEM INTERFACE ${TREE_SITTER_INCLUDE_DIR})
target_link_libraries(tree_sitter_runtime INTERFACE ${TREE_SITTER_LIBRARY})

# yaml-cpp 0.7: the target is `yaml-cpp`; link the archive/library directly so static mode works.
find_path(YAML_CPP_INCLUDE_DIR yaml-cpp/yaml.h REQUIRED)
find_library(YAML_CPP_LIBRARY NAMES yaml-cpp REQUIRED)
add_library(yaml_cpp_lib INTERFACE)
target_include_directories(yaml_cpp_lib SYSTEM INTERFACE ${YAML_CPP_INCLUDE_DIR})
target_link_libraries(yaml_cpp_lib INTERFACE ${YAML_CPP_LIBRARY})

# Nettle 3.8 (nettle-dev): SHA-256 of upstream, spec and output bytes (src/rewriter/sha256.cc). Linked
# like yaml-cpp (libnettle.a in PATCHGEN_STATIC, where only its SHA-256 objects are pulled in).
find_path(NETTLE_INCLUDE_DIR nettle/sha2.h REQUIRED)
find_library(NETTLE_LIBRARY NAMES nettle REQUIRED)
add_library(nettle_lib INTERFACE)
target_include_directories(nettle_lib SYSTEM INTERFACE ${NETTLE_INCLUDE_DIR})
target_link_libraries(nettle_lib INTERFACE ${NETTLE_LIBRARY})

# Abseil 20220623 (libabsl-dev): absl::flat_hash_map / flat_hash_set for lookup tables, StrCat,
# StrJoin and StrSplit for message and path text. Linked from Debian's static archives in every
# build, not only PATCHGEN_STATIC: the archives `pkg-config --static` names, in its order (the
# linker pulls in only the objects used), so no build needs Abseil's shared libraries at run time.
pkg_check_modules(ABSL REQUIRED absl_flat_hash_map absl_flat_hash_set absl_strings)
set(ABSL_ARCHIVES)
foreach(lib IN LISTS ABSL_STATIC_LIBRARIES)
  if(lib MATCHES "^absl_")
    find_library(ABSL_ARCHIVE_${lib} NAMES lib${lib}.a HINTS ${ABSL_LIBRARY_DIRS} REQUIRED)
    list(APPEND ABSL_ARCHIVES ${ABSL_ARCHIVE_${lib}})
  endif()
endforeach()
add_library(absl_static INTERFACE)
target_include_directories(absl_static SYSTEM INTERFACE ${ABSL_INCLUDE_DIRS})
target_compile_options(absl_static INTERFACE ${ABSL_CFLAGS_OTHER})
target_link_libraries(absl_static INTERFACE ${ABSL_ARCHIVES} Threads::Threads)

# Header-only: nlohmann-json, dtl, CLI11, toml++.
find_package(nlohmann_json 3 REQUIRED)
find_path(DTL_INCLUDE_DIR dtl/dtl.hpp REQUIRED)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
find_path(TOMLPP_INCLUDE_DIR toml++/toml.h REQUIRED)

if(PATCHGEN_TESTS)
  find_package(Catch2 2 REQUIRED)
  list(APPEND CMAKE_MODULE_PATH ${Catch2_DIR})
endif()
