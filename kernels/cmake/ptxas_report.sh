#!/usr/bin/env bash
# Compiler launcher of the kernels' CUDA objects (CUDA_COMPILER_LAUNCHER, kernels/CMakeLists.txt):
# runs the compile command it is given, which asks ptxas for its resource report (-Xptxas=-v), and
# writes that report (registers, stack, spills, for every function and target) to <object>.ptxas
# beside the object, where scripts/check_kernel_registers.py reads it. Every other line of the
# compiler's error output passes through. The first argument is `print` (the report is printed
# too: CMake option OPSLOT_KERNELS_PTXAS_VERBOSE) or `quiet`; the compile command follows.
set -u
mode=$1
shift
obj=""
prev=""
for arg in "$@"; do
  if [[ $prev == -o ]]; then obj=$arg; fi
  prev=$arg
done
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$@" 2>"$err"
rc=$?
# ptxas -v: "ptxas info    : ..." lines, and the stack/spill line of each function, indented.
report='^(ptxas info +:|    [0-9]+ bytes stack frame, )'
if [[ -n $obj && $rc -eq 0 ]]; then
  grep -E "$report" "$err" >"$obj.ptxas.tmp" || true
  mv "$obj.ptxas.tmp" "$obj.ptxas"
fi
if [[ $mode == print ]]; then
  cat "$err" >&2
else
  grep -v -E "$report" "$err" >&2 || true
fi
exit $rc
