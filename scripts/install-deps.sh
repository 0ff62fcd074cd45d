#!/usr/bin/env bash
# Installs the Debian packages patchgen needs to build and test. Idempotent: it does nothing
# (no apt-get update, no network) when every package is already installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config nodejs npm patch
  libtree-sitter-dev nlohmann-json3-dev libyaml-cpp-dev libdtl-dev
  libcli11-dev catch2 libtomlplusplus-dev
  python3 python3-torch python3-pytest python3-yaml python3-numpy
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    # node and npm may come from elsewhere (e.g. nodesource); accept any working binary.
    if [[ "$p" == nodejs ]] && command -v node >/dev/null; then continue; fi
    if [[ "$p" == npm ]] && command -v npm >/dev/null; then continue; fi
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
