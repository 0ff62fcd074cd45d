# tree-sitter-python 0.23.6 (grammar ABI 14) comes from the npm registry at configure time:
# the committed package.json + package-lock.json are copied into the build tree and
# `npm ci --ignore-scripts` fetches exactly the locked version. Nothing third-party is committed.
set(GRAMMAR_DIR ${CMAKE_BINARY_DIR}/grammar)
set(GRAMMAR_SRC ${GRAMMAR_DIR}/node_modules/tree-sitter-python/src)
file(MAKE_DIRECTORY ${GRAMMAR_DIR})

set(_lock_src ${CMAKE_SOURCE_DIR}/package-lock.json)
set(_lock_dst ${GRAMMAR_DIR}/package-lock.json)
set(_need_npm TRUE)
if(EXISTS ${GRAMMAR_SRC}/parser.c AND EXISTS ${_lock_dst})
  file(SHA256 ${_lock_src} _h1)
  file(SHA256 ${_lock_dst} _h2)
  if(_h1 STREQUAL _h2)
    set(_need_npm FALSE)
  endif()
endif()
if(_need_npm)
  find_program(NPM npm REQUIRED)
  configure_file(${CMAKE_SOURCE_DIR}/package.json ${GRAMMAR_DIR}/package.json COPYONLY)
  configure_file(${_lock_src} ${_lock_dst} COPYONLY)
  message(STATUS "Fetching tree-sitter-python with npm ci (build tree: ${GRAMMAR_DIR})")
  execute_process(
    COMMAND ${NPM} ci --ignore-scripts --no-audit --no-fund --loglevel=error
    WORKING_DIRECTORY ${GRAMMAR_DIR}
    RESULT_VARIABLE _npm_rc)
  if(NOT _npm_rc EQUAL 0)
    message(FATAL_ERROR "npm ci failed (${_npm_rc}); the grammar comes from the npm registry")
  endif()
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_lock_src} ${CMAKE_SOURCE_DIR}/package.json)

add_library(tree_sitter_python STATIC ${GRAMMAR_SRC}/parser.c ${GRAMMAR_SRC}/scanner.c)
target_include_directories(tree_sitter_python PRIVATE ${GRAMMAR_SRC})
target_compile_options(tree_sitter_python PRIVATE -w -O2)
set_target_properties(tree_sitter_python PROPERTIES POSITION_INDEPENDENT_CODE ON)
