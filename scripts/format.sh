#!/usr/bin/env bash
# clang-format (Debian's clang-format 14, .clang-format at the root) over our C++ and CUDA sources
# (src/, tools/, fuzz/ and the kernels' library, kernels/):
#   scripts/format.sh           rewrite them in place (`make format`)
#   scripts/format.sh --check   list the files that differ and fail (`make format-check`, ctest `format`)
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "format: $CLANG_FORMAT not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files 'src/**.cc' 'src/**.h' 'tools/**.cc' 'tools/**.h' 'fuzz/*.cc' 'fuzz/*.h' \
  'kernels/**.cu' 'kernels/**.cuh' 'kernels/**.h')
if [[ "${1:-}" == "--check" ]]; then
  bad=()
  for f in "${files[@]}"; do
    "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'format: %d of %d files differ from .clang-format (run `make format`):\n' "${#bad[@]}" "${#files[@]}" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files match .clang-format"
  exit 0
fi
"$CLANG_FORMAT" -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
