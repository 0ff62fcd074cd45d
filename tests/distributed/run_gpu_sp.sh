#!/usr/bin/env bash
# The 2-GPU pass of sequence parallelism (issue #32) in one call of the device machine (nvidia-h200-x2):
#   1. patchgen generates Qwen3, Qwen3-MoE and Qwen3.5 from the installed transformers (static binary of `make static`);
#   2. tests/distributed/test_sequence_parallel.py on NCCL, opslot's cuda kernels, bf16 (pytest --device cuda:
#      the 2-process scenarios against the unsharded model; measurements -> sp.sp2.json);
#   3. tests/distributed/bench_sp.py: step time and peak memory of one long row, unsharded on each GPU
#      against SP = 2 (bench_sp.md / bench_sp.json).
# Built here first: `make device-bin` (or `make static`; scripts/device-env.sh reads .device-bin/).
# On the device machine:
#   OUT=... bash tests/distributed/run_gpu_sp.sh      (carry .device-bin)
# Results go to docs/results/sequence_parallel_h200x2.md (written by hand from $OUT).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-gpu-sp}
mkdir -p "$OUT"
BIN=${BIN:-$ROOT/.device-bin}
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$ROOT/scripts/device-env.sh" || exit 2
SITE=$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("transformers"); print(os.path.dirname(os.path.dirname(s.origin)))')
GEN=$(mktemp -d /tmp/opslot-sp-gen.XXXXXX)
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "gpus", torch.cuda.device_count())'
  "$PATCHGEN" specs/qwen3/qwen3_gpu.yaml specs/qwen3_moe/qwen3_moe_gpu.yaml specs/qwen3_5/qwen3_5_gpu.yaml \
    --source-root "$SITE" -o "$GEN"; } 2>&1 | tee "$OUT/summary.txt"
t0=$SECONDS
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -rf tests/distributed/test_sequence_parallel.py \
  --device cuda --patchgen "$PATCHGEN" --source-root "$SITE" --results-json "$OUT/sp" > "$OUT/tests.txt" 2>&1
echo "tests rc=$? $((SECONDS - t0))s: $(tail -1 "$OUT/tests.txt")" | tee -a "$OUT/summary.txt"
t0=$SECONDS
timeout "${BENCH_TIMEOUT:-300}" python3 tests/distributed/bench_sp.py --module-dir "$GEN" --out "$OUT/bench_sp.md" \
  ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1
echo "bench rc=$? $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
grep -v Warning "$OUT/bench.txt" | tail -30
