#!/usr/bin/env bash
# The layout of our sources, C++ and Python:
#  - clang-format (Debian's clang-format 14, .clang-format at the root) over our C++ and CUDA sources
#    (src/, tools/, fuzz/ and the kernels' library, kernels/);
#  - ruff (pinned in requirements/test.txt, installed into .venv/; [tool.ruff] in pyproject.toml) over
#    our Python (runtime/, tests/, bench/, scripts/, fuzz/): `ruff format` and `ruff check` (pyflakes,
#    pycodestyle's errors, import order). pyproject.toml excludes what must stay byte for byte: golden
#    files, fixtures, generated files, the upstream-style example package, spec patch snippets.
#   scripts/format.sh           rewrite them in place (`make format`; `ruff check --fix`: safe fixes only)
#   scripts/format.sh --check   list what differs or what ruff finds, and fail (`make format-check`,
#                               ctest `format` in `make test`)
# PYTHON (default: .venv/bin/python) is the Python whose ruff runs.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
PYTHON=${PYTHON:-.venv/bin/python}
PY_DIRS=(runtime tests bench scripts fuzz)
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "format: $CLANG_FORMAT not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
# The ruff of requirements/test.txt, nothing else: another release formats differently.
pinned=$(sed -n 's/^ruff==\([^ ]*\) .*/\1/p' requirements/test.txt)
have=$("$PYTHON" -m ruff --version 2>/dev/null | awk '{print $2}') || true
if [[ -z "$have" ]]; then
  echo "format: ruff not found in $PYTHON's environment (\`make venv\` installs ruff $pinned from requirements/test.txt)" >&2
  exit 2
fi
if [[ "$have" != "$pinned" ]]; then
  echo "format: $PYTHON has ruff $have, requirements/test.txt pins $pinned (run \`make venv\`)" >&2
  exit 2
fi
ruff=("$PYTHON" -m ruff)
mapfile -t files < <(git ls-files 'src/**.cc' 'src/**.h' 'tools/**.cc' 'tools/**.h' 'fuzz/*.cc' 'fuzz/*.h' \
  'kernels/**.cu' 'kernels/**.cuh' 'kernels/**.h' 'kernels/**.cc')
if [[ "${1:-}" == "--check" ]]; then
  failed=0
  bad=()
  for f in "${files[@]}"; do
    "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'format: %d of %d files differ from .clang-format (run `make format`):\n' "${#bad[@]}" "${#files[@]}" >&2
    printf '  %s\n' "${bad[@]}" >&2
    failed=1
  else
    echo "format: ${#files[@]} files match .clang-format"
  fi
  # The pre-commit hooks run the same ruff.
  hook=$(sed -n 's/.*ruff==\([0-9][^"'\'' ]*\).*/\1/p' .pre-commit-config.yaml | sort -u)
  if [[ "$hook" != "$pinned" ]]; then
    echo "format: .pre-commit-config.yaml's ruff ($hook) is not requirements/test.txt's ($pinned)" >&2
    failed=1
  fi
  if ! "${ruff[@]}" format --check --quiet "${PY_DIRS[@]}"; then
    echo "format: the Python files above differ from ruff format (run \`make format\`)" >&2
    failed=1
  fi
  if ! "${ruff[@]}" check --quiet --output-format concise "${PY_DIRS[@]}"; then
    echo "format: ruff check found the above (\`make format\` fixes the safe ones; the rest by hand)" >&2
    failed=1
  fi
  if ((failed == 0)); then echo "format: Python files match ruff $pinned (format and check)"; fi
  exit "$failed"
fi
"$CLANG_FORMAT" -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
"${ruff[@]}" check --fix --quiet "${PY_DIRS[@]}" || true  # what it cannot fix: `scripts/format.sh --check`
"${ruff[@]}" format --quiet "${PY_DIRS[@]}"
echo "format: Python files formatted (ruff $pinned)"
