#!/usr/bin/env bash
# GPU check of the `cuda` cross-entropy: its tests, then bench/cross_entropy.py (tables to $OUT).
# On the device machine, from the repository root, with the library built here and carried:
#   OPSLOT_KERNELS_LIB=$PWD/.device-bin/ce/libopslot_kernels.so bash tests/gpu/kernels/run_cross_entropy.sh
set -o pipefail
export PYTHONUNBUFFERED=1
export OPSLOT_KERNELS_LIB=${OPSLOT_KERNELS_LIB:-$PWD/.device-bin/ce/libopslot_kernels.so}
OUT=${OUT:-/tmp/ce_out}
mkdir -p "$OUT"
if ls .whl/liger_kernel-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/liger_kernel-*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/kernels/test_cross_entropy.py 2>&1 | tee "$OUT/tests.txt"
python3 bench/cross_entropy.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_log.txt"
