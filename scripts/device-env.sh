# Sourced on the GPU machine (bash): the inputs that `make static` or `make device-bin` put in
# .device-bin/ (or $BIN), where the runtime, the tests and the benchmarks look for them.
#
#   source scripts/device-env.sh && python3 -m pytest -q tests/gpu/kernels/test_topk.py
#
# Sets and exports, each only where it is not set already: OPSLOT_KERNELS_LIB, OPSLOT_KERNELS_BENCH_LIB
# (where the bench library was packed), OPSLOT_TORCH_LIB, PATCHGEN and PATCHGEN_BIN; puts runtime/
# first on PYTHONPATH. A library packed (NAME.so.xz from `make device-bin`, to fit the device tool's
# 64 MiB carry, or NAME.so.gz) is unpacked into /tmp/opslot-device/, once per packing (.xz by
# Python's lzma: the GPU machine need not have xz). Prints what it set and
# the commit the libraries were built from (.device-bin/COMMIT); returns 1, setting nothing, where
# .device-bin holds no kernels' library.

_od_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_od_bin=${BIN:-$_od_root/.device-bin}

# Packed library $1 to stdout: .xz by Python's lzma, .gz by gunzip.
_od_unpack() {
  case "$1" in
    *.xz)
      python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1" ;;
    *) gunzip -c "$1" ;;
  esac
}

# The path of library $1 in $_od_bin, unpacked first where it is packed; nothing where it is absent.
_od_lib() {
  local so="$_od_bin/$1" out="/tmp/opslot-device/$1" packed
  if [ -f "$so" ]; then
    printf '%s\n' "$so"
    return 0
  fi
  if [ -f "$so.xz" ]; then
    packed=$so.xz
  elif [ -f "$so.gz" ]; then
    packed=$so.gz
  else
    return 0
  fi
  if [ ! -f "$out" ] || [ "$packed" -nt "$out" ]; then
    mkdir -p /tmp/opslot-device && _od_unpack "$packed" > "$out.part" && mv "$out.part" "$out" || return 1
  fi
  printf '%s\n' "$out"
}

if [ -z "${OPSLOT_KERNELS_LIB:-}" ] && [ -z "$(_od_lib libopslot_kernels.so)" ]; then
  echo "device-env.sh: no libopslot_kernels.so(.xz, .gz) in $_od_bin:" \
    "run 'make device-bin' (or 'make static') and carry .device-bin" >&2
  unset -f _od_lib _od_unpack
  unset _od_root _od_bin
  return 1
fi
: "${OPSLOT_KERNELS_LIB:=$(_od_lib libopslot_kernels.so)}"
: "${OPSLOT_KERNELS_BENCH_LIB:=$(_od_lib libopslot_kernels_bench.so)}"
: "${OPSLOT_TORCH_LIB:=$(_od_lib libopslot_torch.so)}"
: "${PATCHGEN:=$_od_bin/patchgen}"
: "${PATCHGEN_BIN:=$PATCHGEN}"
export OPSLOT_KERNELS_LIB PATCHGEN PATCHGEN_BIN
[ -n "$OPSLOT_KERNELS_BENCH_LIB" ] && export OPSLOT_KERNELS_BENCH_LIB || unset OPSLOT_KERNELS_BENCH_LIB
[ -n "$OPSLOT_TORCH_LIB" ] && export OPSLOT_TORCH_LIB || unset OPSLOT_TORCH_LIB
export PYTHONPATH="$_od_root/runtime${PYTHONPATH:+:$PYTHONPATH}"
echo "device-env.sh: libraries of $(cat "$_od_bin/COMMIT" 2>/dev/null || echo 'an unrecorded commit'):" \
  "OPSLOT_KERNELS_LIB=$OPSLOT_KERNELS_LIB OPSLOT_KERNELS_BENCH_LIB=${OPSLOT_KERNELS_BENCH_LIB:-(none)}" \
  "OPSLOT_TORCH_LIB=${OPSLOT_TORCH_LIB:-(none)} PATCHGEN=$PATCHGEN"
unset -f _od_lib _od_unpack
unset _od_root _od_bin
