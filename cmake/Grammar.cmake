# The tree-sitter-python grammar, 0.23.6 (grammar ABI 14), compiled into patchgen. Its C sources
# come from PyPI sdists, pinned by version and sha256, verified before use; nothing third-party is
# committed. The downloads are kept in .deps/ (git-ignored) so that a new build tree needs no network.
#
#   tree-sitter-python 0.23.6 sdist: src/parser.c, src/scanner.c
#   tree-sitter 0.23.2 sdist (the Python binding, which bundles the C library): the headers a
#     grammar includes as tree_sitter/{parser,array,alloc,ts_assert}.h. The grammar's own sdist
#     omits them (its MANIFEST ships only src/*.c); tree-sitter's CLI copies exactly these files of
#     the C library into every generated grammar, and 0.23.2 is the library of the same release line.
# The parser links against Debian's libtree-sitter runtime (cmake/Dependencies.cmake).
set(GRAMMAR_DEPS_DIR ${CMAKE_SOURCE_DIR}/.deps CACHE PATH "Where the grammar's sdists are downloaded to")
set(GRAMMAR_DIR ${CMAKE_BINARY_DIR}/grammar)

set(_sdists
  "tree-sitter-python|0.23.6|tree_sitter_python-0.23.6.tar.gz|354bfa0a2f9217431764a631516f85173e9711af2c13dbd796a8815acfe505d9"
  "tree-sitter|0.23.2|tree-sitter-0.23.2.tar.gz|66bae8dd47f1fed7bdef816115146d3a41c39b5c482d7bad36d9ba1def088450")

# pip of the PATH's python3 first (pyenv or Debian), found by name like a user would run it.
find_program(GRAMMAR_PYTHON NAMES python3 REQUIRED)
foreach(entry IN LISTS _sdists)
  string(REPLACE "|" ";" entry "${entry}")
  list(GET entry 0 _name)
  list(GET entry 1 _version)
  list(GET entry 2 _file)
  list(GET entry 3 _sha256)
  set(_path ${GRAMMAR_DEPS_DIR}/${_file})
  if(EXISTS ${_path})
    file(SHA256 ${_path} _have)
    if(NOT _have STREQUAL _sha256)
      message(STATUS "${_path}: sha256 ${_have} is not the pinned ${_sha256}; downloading again")
      file(REMOVE ${_path})
    endif()
  endif()
  if(NOT EXISTS ${_path})
    message(STATUS "Downloading the ${_name} ${_version} sdist from PyPI into ${GRAMMAR_DEPS_DIR}")
    # Without PYTHONPATH/PYTHONNOUSERSITE: inside pip's isolated build environment (pip install .)
    # they hide the interpreter's own pip.
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
              ${GRAMMAR_PYTHON} -m pip download --quiet --disable-pip-version-check --no-deps
              --no-binary :all: -d ${GRAMMAR_DEPS_DIR} ${_name}==${_version}
      RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0 OR NOT EXISTS ${_path})
      message(FATAL_ERROR "pip download of the ${_name} ${_version} sdist failed (${_rc}); it comes from PyPI")
    endif()
    file(SHA256 ${_path} _have)
    if(NOT _have STREQUAL _sha256)
      message(FATAL_ERROR "${_path}: sha256 ${_have} is not the pinned ${_sha256}; refusing to build with it")
    endif()
  endif()
  set(_sdist_${_name} ${_path})
endforeach()

# Unpack only what is compiled, into the build tree (again whenever a pinned hash changes).
set(_stamp ${GRAMMAR_DIR}/.sha256)
set(_want "")
foreach(entry IN LISTS _sdists)
  string(APPEND _want "${entry}\n")
endforeach()
set(_have_stamp "")
if(EXISTS ${_stamp})
  file(READ ${_stamp} _have_stamp)
endif()
set(GRAMMAR_SRC ${GRAMMAR_DIR}/tree_sitter_python-0.23.6/src)
set(GRAMMAR_INCLUDE ${GRAMMAR_DIR}/include)
if(NOT _have_stamp STREQUAL _want OR NOT EXISTS ${GRAMMAR_SRC}/parser.c)
  file(REMOVE_RECURSE ${GRAMMAR_DIR})
  file(MAKE_DIRECTORY ${GRAMMAR_DIR} ${GRAMMAR_INCLUDE}/tree_sitter)
  file(ARCHIVE_EXTRACT INPUT ${_sdist_tree-sitter-python} DESTINATION ${GRAMMAR_DIR}
       PATTERNS tree_sitter_python-0.23.6/src/parser.c tree_sitter_python-0.23.6/src/scanner.c)
  file(ARCHIVE_EXTRACT INPUT ${_sdist_tree-sitter} DESTINATION ${GRAMMAR_DIR}/tree-sitter
       PATTERNS tree-sitter-0.23.2/tree_sitter/core/lib/src/parser.h tree-sitter-0.23.2/tree_sitter/core/lib/src/array.h
                tree-sitter-0.23.2/tree_sitter/core/lib/src/alloc.h tree-sitter-0.23.2/tree_sitter/core/lib/src/ts_assert.h)
  foreach(h parser array alloc ts_assert)
    file(COPY ${GRAMMAR_DIR}/tree-sitter/tree-sitter-0.23.2/tree_sitter/core/lib/src/${h}.h
         DESTINATION ${GRAMMAR_INCLUDE}/tree_sitter)
  endforeach()
  file(WRITE ${_stamp} "${_want}")
endif()

add_library(tree_sitter_python STATIC ${GRAMMAR_SRC}/parser.c ${GRAMMAR_SRC}/scanner.c)
target_include_directories(tree_sitter_python PRIVATE ${GRAMMAR_INCLUDE})
target_compile_options(tree_sitter_python PRIVATE -w -O2)
set_target_properties(tree_sitter_python PROPERTIES POSITION_INDEPENDENT_CODE ON)
