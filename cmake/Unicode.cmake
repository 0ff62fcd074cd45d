# The Unicode tables of patchgen's NFKC normaliser (src/base/unicode_nfkc.cc): generated at build
# time from the `unicodedata` module of a Python 3 by scripts/gen_unicode_tables.py into the build
# tree, never committed (Unicode's data is third-party). Python normalises identifiers with NFKC
# (PEP 3131), and patchgen compares them as the Python that runs the generated code does, so the
# tables come from the project's Python: PATCHGEN_UNICODE_PYTHON, by default the tests' Python
# (PATCHGEN_TEST_PYTHON, the venv) when it exists, else the PATH's python3 (docs/parser.md,
# "Identifiers are compared as Python compares them").
if(DEFINED PATCHGEN_TEST_PYTHON AND EXISTS "${PATCHGEN_TEST_PYTHON}")
  set(_unicode_python_default "${PATCHGEN_TEST_PYTHON}")
elseif(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python")
  set(_unicode_python_default "${CMAKE_SOURCE_DIR}/.venv/bin/python")
else()
  set(_unicode_python_default "${GRAMMAR_PYTHON}")
endif()
set(PATCHGEN_UNICODE_PYTHON "${_unicode_python_default}" CACHE FILEPATH
    "Python whose unicodedata gives the NFKC tables of identifiers")

set(PATCHGEN_UNICODE_DIR ${CMAKE_BINARY_DIR}/generated)
set(PATCHGEN_UNICODE_TABLES ${PATCHGEN_UNICODE_DIR}/unicode_nfkc_tables.inc)
# The unit tests' expectations (every code point and a sample of sequences against
# unicodedata.normalize("NFKC", ...)), written by the same run.
set(PATCHGEN_UNICODE_EXPECTATIONS ${PATCHGEN_UNICODE_DIR}/unicode_nfkc_expected.txt)
set(_unicode_outputs ${PATCHGEN_UNICODE_TABLES})
set(_unicode_args --tables ${PATCHGEN_UNICODE_TABLES})
if(PATCHGEN_TESTS)
  list(APPEND _unicode_outputs ${PATCHGEN_UNICODE_EXPECTATIONS})
  list(APPEND _unicode_args --expectations ${PATCHGEN_UNICODE_EXPECTATIONS})
endif()
file(MAKE_DIRECTORY ${PATCHGEN_UNICODE_DIR})
add_custom_command(
  OUTPUT ${_unicode_outputs}
  COMMAND ${PATCHGEN_UNICODE_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/gen_unicode_tables.py ${_unicode_args}
  DEPENDS ${CMAKE_SOURCE_DIR}/scripts/gen_unicode_tables.py ${PATCHGEN_UNICODE_PYTHON}
  COMMENT "Generating the NFKC tables from ${PATCHGEN_UNICODE_PYTHON}'s unicodedata"
  VERBATIM)
add_custom_target(patchgen_unicode_tables DEPENDS ${_unicode_outputs})
