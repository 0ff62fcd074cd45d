#!/usr/bin/env bash
# Makes the one Python environment of the tests, .venv/ (git-ignored), from requirements/test.txt
# (every package pinned with its sha256: pip --require-hashes). Idempotent: it does nothing when
# .venv/ was made from the same requirements file (its sha256 is stored in .venv/.requirements.sha256);
# after the file changed, pip brings the existing .venv/ to the new pins.
# PyPI's torch 2.11.0 wheel is a CUDA build (about 3 GB with its nvidia-* wheels); it runs on the
# CPU, and pip's cache makes a second install fast.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
REQ=$ROOT/requirements/test.txt
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x "$VENV/bin/python" && -f "$VENV/.requirements.sha256" && "$(cat "$VENV/.requirements.sha256")" == "$want" ]]; then
  exit 0
fi
# Any Python 3.10+ with venv: the PATH's python3 first, then Debian's.
PY=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    PY=$cand; break
  fi
done
[[ -n "$PY" ]] || { echo "setup-venv: no python3 >= 3.10 with venv and ensurepip" >&2; exit 2; }
start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
  # A new venv holds about 5 GiB (torch's CUDA wheels); pip also unpacks the downloads under
  # TMPDIR. Say so before pip runs out of space halfway.
  need_kib=$(( ${SETUP_VENV_NEED_GIB:-6} * 1024 * 1024 ))
  parent=$(dirname "$VENV")
  while [[ ! -d "$parent" ]]; do parent=$(dirname "$parent"); done  # venv makes missing parents
  free_kib=$(df -Pk "$parent" | awk 'NR == 2 { print $4 }')
  if [[ -n "$free_kib" && "$free_kib" -lt "$need_kib" ]]; then
    echo "setup-venv: $(( free_kib / 1024 / 1024 )) GiB free under $parent; a new .venv needs about" \
      "${SETUP_VENV_NEED_GIB:-6} GiB (torch 2.11's CUDA wheels). Free some space, or set" \
      "VENV=/a/roomier/path (SETUP_VENV_NEED_GIB=N changes the threshold)." >&2
    exit 2
  fi
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input --require-hashes -r "$REQ"
echo "$want" > "$VENV/.requirements.sha256"
echo "setup-venv: $VENV ready ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')) in $(( $(date +%s) - start )) s" >&2
