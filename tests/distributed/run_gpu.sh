#!/usr/bin/env bash
# The 2-GPU pass of the distributed tests in one call of the device machine (nvidia-h200-x2):
#   1. patchgen generates the Qwen3-MoE from the installed transformers (static binary from `make static`);
#   2. tests/distributed on NCCL, opslot's cuda kernels, bf16 (pytest --device cuda; measurements -> tests_cuda.json);
#   3. bench/distributed.py: the throughput table (tokens/s and peak memory per GPU).
# Built here first: `make device-bin` (or `make static`; scripts/device-env.sh reads .device-bin/).
# On the device machine:
#   OUT=... bash tests/distributed/run_gpu.sh      (carry .device-bin)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-gpu-distributed}
mkdir -p "$OUT"
BIN=${BIN:-$ROOT/.device-bin}
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$ROOT/scripts/device-env.sh" || exit 2
SITE=$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("transformers"); print(os.path.dirname(os.path.dirname(s.origin)))')
GEN=$(mktemp -d /tmp/opslot-dist-gen.XXXXXX)
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "gpus", torch.cuda.device_count())'
  "$PATCHGEN" specs/qwen3_moe/qwen3_moe_gpu.yaml --source-root "$SITE" -o "$GEN"; } 2>&1 | tee "$OUT/summary.txt"
t0=$SECONDS
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -rf tests/distributed --device cuda \
  --patchgen "$PATCHGEN" --source-root "$SITE" --results-json "$OUT/tests_cuda.json" > "$OUT/tests.txt" 2>&1
echo "tests rc=$? $((SECONDS - t0))s: $(tail -1 "$OUT/tests.txt")" | tee -a "$OUT/summary.txt"
t0=$SECONDS
timeout "${BENCH_TIMEOUT:-140}" python3 bench/distributed.py --module-dir "$GEN" --out "$OUT/throughput.md" ${BENCH_ARGS:-} \
  > "$OUT/bench.txt" 2>&1
echo "bench rc=$? $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
grep -v Warning "$OUT/bench.txt" | tail -12
