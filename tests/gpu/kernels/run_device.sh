#!/usr/bin/env bash
# On the GPU machine: the CUDA kernel tests, then the benchmark (tables to $OUT).
#   [OPSLOT_KERNELS_LIB=...] [OPSLOT_KERNELS_BENCH_LIB=...] OUT=... [TESTS='files'] [SKIP_BENCH=1] \
#     [BENCH_ARGS=--tune] [RMS_VERSIONS='1 2'] tests/gpu/kernels/run_device.sh [pytest args]
# The libraries: those variables where set, else .device-bin/'s (`make device-bin`, carried;
# scripts/device-env.sh). The knob tests, RMS_VERSIONS and the --tune sweeps run on the bench
# library (libopslot_kernels_bench.so), found at $OPSLOT_KERNELS_BENCH_LIB or beside the production
# library; without it they skip (RMS_VERSIONS fails).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$ROOT"
source "$ROOT/scripts/device-env.sh" || exit 2
OUT=${OUT:-$ROOT/build-gpu-kernels}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/liger_kernel-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/liger_kernel-*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q --maxfail=40 --tb=short -p no:cacheprovider ${TESTS:-tests/gpu/kernels} "$@" 2>&1 | tee "$OUT/tests.txt" | tail -40
test_rc=${PIPESTATUS[0]}
# RMS_VERSIONS="1 2": the RMSNorm tests once more per listed kernel version, every variant forced
# onto it (the default run takes version 3 where it applies; RMS_V1=1 is RMS_VERSIONS=1).
for v in ${RMS_VERSIONS:-${RMS_V1:+1}}; do
  OPSLOT_RMS_TEST_VERSION=$v timeout 120 python3 -m pytest -q --maxfail=20 --tb=short -p no:cacheprovider \
    tests/gpu/kernels/test_norms.py 2>&1 | tee "$OUT/tests_rms_v$v.txt" | tail -4
done
bench_rc=skipped
if [[ -z "${SKIP_BENCH:-}" ]]; then
  timeout ${BENCH_TIMEOUT:-280} python3 bench/kernels.py --out "$OUT/kernels_h200.md" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
  bench_rc=${PIPESTATUS[0]}
fi
echo "tests rc=$test_rc bench rc=$bench_rc"
