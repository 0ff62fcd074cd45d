#!/usr/bin/env bash
# Installs the Debian packages patchgen needs to build and test. Idempotent: it does nothing
# (no apt-get update, no network) when every package is already installed.
set -euo pipefail

# clang-14 and its libFuzzer/sanitizer runtime build the fuzz targets (fuzz/, docs/fuzzing.md);
# nettle-dev provides SHA-256 (src/rewriter/sha256.cc; libnettle.a for the static build);
# clang-format checks the C++ layout (scripts/format.sh, the `format` ctest suite);
# libabsl-dev provides Abseil's hash tables and string functions, linked from its static archives
# (cmake/Dependencies.cmake).
# Python packages (torch, transformers, pytest, ...) are not Debian's: they come from PyPI into
# .venv/ (scripts/setup-venv.sh, pinned with hashes in requirements/test.txt).
PACKAGES=(
  build-essential cmake ninja-build pkg-config patch
  libtree-sitter-dev nlohmann-json3-dev libyaml-cpp-dev libdtl-dev
  libcli11-dev catch2 libtomlplusplus-dev nettle-dev libabsl-dev
  python3 python3-venv
  clang-14 libclang-rt-14-dev
  clang-format clang-tidy
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    if [[ "$p" == cmake ]] && command -v cmake >/dev/null; then continue; fi
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
