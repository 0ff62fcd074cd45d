#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, own build tree) and fuzzes each for a while,
# starting from seeds made from the test data (fuzz/make_corpus.py, into the work folder) and the
# committed regress-* inputs (fuzz/corpus/<target>/). Then
# every generated module of fuzz_generate's final corpus is compiled with CPython
# (fuzz/check_outputs.py). docs/fuzzing.md describes the targets and the property they assert.
#
#   fuzz/run_fuzz.sh [--seconds N | --deterministic] [--build-dir DIR] [--work-dir DIR] [--python PY] [TARGET...]
#
# Defaults: 40 s per target, build-fuzz/, a fresh temporary work folder (new corpus entries and
# crash inputs; kept and printed when something fails). --deterministic (the `fuzz` ctest suite of
# `make test`): a fixed seed and a fixed number of runs per target (about 40 s each on 2 cores), so
# that a CI run is reproducible and a red one is not a matter of luck; --seconds explores.
# Exit 0: no crash, hang, leak, sanitizer report or property violation; 1 otherwise. Exit 0 with a
# "skipped" line when clang-14 or its libFuzzer runtime is missing (scripts/install-deps.sh
# installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SECONDS_PER_TARGET=40
DETERMINISTIC=0
BUILD_DIR=$ROOT/build-fuzz
WORK_DIR=""
PYTHON=python3
TARGETS=()
while (($#)); do
  case "$1" in
    --seconds) SECONDS_PER_TARGET=$2; shift 2 ;;
    --deterministic) DETERMINISTIC=1; shift ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
((${#TARGETS[@]})) || TARGETS=(fuzz_spec fuzz_index fuzz_generate)

CC=${FUZZ_CC:-clang-14}
CXX=${FUZZ_CXX:-clang++-14}
if ! command -v "$CXX" >/dev/null || ! command -v "$CC" >/dev/null; then
  echo "fuzz: skipped: $CXX not found (scripts/install-deps.sh installs clang-14)"
  exit 0
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$CXX" -x c++ -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "fuzz: skipped: $CXX cannot link -fsanitize=fuzzer (scripts/install-deps.sh installs libclang-rt-14-dev)"
  exit 0
fi

JOBS=${JOBS:-$(nproc)}
if [[ ! -f $BUILD_DIR/build.ninja ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
    -DPATCHGEN_FUZZ=ON -DPATCHGEN_TESTS=OFF -DPATCHGEN_KERNELS=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}" | { grep -v '^\[' || true; }

if [[ -z $WORK_DIR ]]; then
  WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/patchgen-fuzz-run.XXXXXX")
  CLEAN_WORK=1
else
  mkdir -p "$WORK_DIR"
  CLEAN_WORK=0
fi

# Inputs larger than this are not generated (the seeds are smaller; the 4 MiB file limit and the
# YAML bounds are tested by the CLI and golden tests, not by mutation).
declare -A MAX_LEN=([fuzz_spec]=16384 [fuzz_index]=32768 [fuzz_generate]=65536)
# --deterministic run counts: about 40 s each at the CI machine's rates (fuzz_spec ~1,000 execs/s,
# fuzz_index ~250, fuzz_generate ~70, measured in the 40-second runs).
declare -A DET_RUNS=([fuzz_spec]=30000 [fuzz_index]=8000 [fuzz_generate]=2500)
"$PYTHON" "$ROOT/fuzz/make_corpus.py" "$WORK_DIR/seeds" >/dev/null
# The seed folders of a target: the derived seeds, and the committed regress-* inputs if any.
seed_dirs() {
  echo "$WORK_DIR/seeds/$1"
  if [[ -d $ROOT/fuzz/corpus/$1 ]]; then echo "$ROOT/fuzz/corpus/$1"; fi
}
status=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for t in "${TARGETS[@]}"; do
  corpus=$WORK_DIR/$t/corpus
  artifacts=$WORK_DIR/$t/artifacts/
  mkdir -p "$corpus" "$artifacts"
  log=$WORK_DIR/$t/fuzz.log
  # -timeout: one input may take at most 10 s (a hang is a finding); -rss_limit_mb: 2 GB.
  # --deterministic: seed 1 and a fixed run count instead of a time budget.
  budget=(-max_total_time="$SECONDS_PER_TARGET")
  ((DETERMINISTIC)) && budget=(-seed=1 -runs="${DET_RUNS[$t]}")
  if "$BUILD_DIR/fuzz/$t" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 \
       -max_len="${MAX_LEN[$t]}" -print_final_stats=1 -artifact_prefix="$artifacts" \
       "$corpus" $(seed_dirs "$t") >"$log" 2>&1; then
    stats=$(grep -E '^(#[0-9]+\s+DONE|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' "$log" |
            tr -s ' \t' ' ' | tr '\n' ' ')
    if ((DETERMINISTIC)); then echo "fuzz: $t: ok, seed 1, ${DET_RUNS[$t]} runs: $stats"
    else echo "fuzz: $t: ok, ${SECONDS_PER_TARGET} s: $stats"; fi
  else
    status=1
    echo "fuzz: $t: FAILED (log: $log, inputs: $artifacts)"
    grep -E -A30 'patchgen fuzz property violated|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY' "$log" | head -60
    CLEAN_WORK=0
  fi
done

# The generated modules of fuzz_generate's corpus must compile with CPython (where their upstream does).
if [[ " ${TARGETS[*]} " == *" fuzz_generate "* ]]; then
  dump=$WORK_DIR/fuzz_generate/outputs
  rm -rf "$dump" && mkdir -p "$dump"
  PATCHGEN_FUZZ_DUMP=$dump "$BUILD_DIR/fuzz/fuzz_generate" -runs=0 "$WORK_DIR/fuzz_generate/corpus" \
    $(seed_dirs fuzz_generate) >"$WORK_DIR/fuzz_generate/replay.log" 2>&1 || {
      status=1; echo "fuzz: fuzz_generate: replay of the corpus failed ($WORK_DIR/fuzz_generate/replay.log)"; CLEAN_WORK=0; }
  if ! "$PYTHON" "$ROOT/fuzz/check_outputs.py" "$dump"; then
    status=1
    CLEAN_WORK=0
  fi
fi

if ((CLEAN_WORK)); then rm -rf "$WORK_DIR"; else echo "fuzz: work folder kept: $WORK_DIR"; fi
exit $status
