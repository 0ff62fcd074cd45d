#!/usr/bin/env bash
# Regenerates requirements/test.txt (every package pinned with its sha256) from requirements/test.in
# with pip-tools' pip-compile, installed into a throw-away venv. Existing pins are kept unless
# test.in asks otherwise; pass --upgrade to move everything to the newest allowed versions.
# Takes several minutes (resolving torch's CUDA dependencies).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$(mktemp -d /tmp/patchgen-lock.XXXXXX)
trap 'rm -rf "$TOOLS"' EXIT
python3 -m venv "$TOOLS"
"$TOOLS/bin/pip" install -q --disable-pip-version-check pip-tools==7.6.2
cd "$ROOT/requirements"
"$TOOLS/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url "$@" \
  -o test.txt test.in
echo "lock-requirements: requirements/test.txt updated; run 'make venv' to install it" >&2
