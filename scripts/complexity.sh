#!/usr/bin/env bash
# Cognitive complexity of every function in src/ and tools/ (tests excluded): clang-tidy 14's
# readability-function-cognitive-complexity at threshold 25 (issue #19), as errors.
#   scripts/complexity.sh BUILD_DIR     (BUILD_DIR holds compile_commands.json; ctest `complexity`)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
CLANG_TIDY=${CLANG_TIDY:-clang-tidy}
if ! command -v "$CLANG_TIDY" >/dev/null; then
  echo "complexity: $CLANG_TIDY not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files 'src/**.cc' 'tools/**.cc' | grep -v '_test\.cc$')
# -Wno-unknown-warning-option: the build's GCC-only warning flags are unknown to clang.
rc=0
out=$("$CLANG_TIDY" -p "$BUILD_DIR" --quiet --extra-arg=-Wno-unknown-warning-option \
  -checks='-*,readability-function-cognitive-complexity' --warnings-as-errors='*' \
  -config='{CheckOptions: [{key: readability-function-cognitive-complexity.Threshold, value: 25}]}' \
  "${files[@]}" 2>&1) || rc=$?
grep -v '^[0-9]* warnings\? generated\.$' <<<"$out" || true
if ((rc != 0)); then
  echo "complexity: a function above cognitive complexity 25 (or clang-tidy failed), see above" >&2
  exit 1
fi
echo "complexity: ${#files[@]} files, no function above cognitive complexity 25"
