#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, own build tree) and fuzzes each for a while,
# starting from seeds made from the test data (fuzz/make_corpus.py, into the work folder) and the
# committed regress-* inputs (fuzz/corpus/<target>/). Then
# every generated module of fuzz_generate's final corpus is compiled with CPython
# (fuzz/check_outputs.py). docs/fuzzing.md describes the targets and the property they assert.
#
#   fuzz/run_fuzz.sh [--seconds N | --deterministic | --check-repro] [--build-dir DIR]
#                    [--work-dir DIR] [--python PY] [TARGET...]
#
# Defaults: 40 s per target, build-fuzz/, a fresh temporary work folder (new corpus entries and
# crash inputs; kept and printed when something fails). --deterministic (the `fuzz` ctest suite of
# `make test`): seed 1 and a fixed number of runs per target (about 40 s each on 2 cores) from an
# empty corpus, so that a CI run is reproducible and a red one is not a matter of luck; --seconds
# explores. A seed alone does not repeat a run (libFuzzer's CMP mutations copy compared values,
# addresses among them, into inputs; docs/fuzzing.md): --deterministic also runs each target with
# ASLR off, a fixed environment, fixed relative paths, a fixed scratch folder, no timed corpus
# reload; its "ok" lines end with a digest of libFuzzer's progression, the same in every run of one
# commit on one machine. --check-repro: --deterministic, each target twice, exit 1 if they differ.
# Exit 0: no crash, hang, leak, sanitizer report or property violation; 1 otherwise. Exit 0 with a
# "skipped" line when clang-14 or its libFuzzer runtime is missing (scripts/install-deps.sh
# installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SECONDS_PER_TARGET=40
DETERMINISTIC=0
CHECK_REPRO=0
BUILD_DIR=$ROOT/build-fuzz
WORK_DIR=""
PYTHON=python3
TARGETS=()
while (($#)); do
  case "$1" in
    --seconds) SECONDS_PER_TARGET=$2; shift 2 ;;
    --deterministic) DETERMINISTIC=1; shift ;;
    --check-repro) DETERMINISTIC=1; CHECK_REPRO=1; shift ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0" | cut -c3-; exit 0 ;;
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

BUILD_DIR=$(realpath -m "$BUILD_DIR")
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
  WORK_DIR=$(realpath "$WORK_DIR")
  CLEAN_WORK=0
fi
SCRATCH=""
LOCKED=0
# shellcheck disable=SC2317  # called by the EXIT trap
finish() {
  if ((LOCKED)); then unlock_scratch; fi
  if ((CLEAN_WORK)); then rm -rf "$WORK_DIR"; else echo "fuzz: work folder kept: $WORK_DIR"; fi
}
trap finish EXIT
trap 'exit 130' INT TERM

# Inputs larger than this are not generated (the seeds are smaller; the 4 MiB file limit and the
# YAML bounds are tested by the CLI and golden tests, not by mutation).
declare -A MAX_LEN=([fuzz_spec]=16384 [fuzz_index]=32768 [fuzz_generate]=65536)
# --deterministic run counts: about 40 s each at the CI machine's rates (fuzz_spec ~1,000 execs/s,
# fuzz_index ~250, fuzz_generate ~70, measured in the 40-second runs).
declare -A DET_RUNS=([fuzz_spec]=30000 [fuzz_index]=8000 [fuzz_generate]=2500)
"$PYTHON" "$ROOT/fuzz/make_corpus.py" "$WORK_DIR/seeds" >/dev/null
# The committed regress-* inputs, copied next to the seeds: every fuzzer runs in its own folder of
# the work folder (<work>/<target>/) and names all it reads and writes by the same relative paths,
# so no path of this run (work folder, clone) reaches libFuzzer's or the target's memory.
rm -rf "$WORK_DIR/regress"
for t in "${TARGETS[@]}"; do
  if [[ -d $ROOT/fuzz/corpus/$t ]]; then
    mkdir -p "$WORK_DIR/regress" && cp -R "$ROOT/fuzz/corpus/$t" "$WORK_DIR/regress/"
  fi
done
# The seed folders of a target, relative to its run folder: derived seeds, regress inputs.
seed_dirs() {
  echo "../seeds/$1"
  if [[ -d $WORK_DIR/regress/$1 ]]; then echo "../regress/$1"; fi
}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# --deterministic: what the process sees is the same in every run. ASLR off (libFuzzer's CMP
# mutations insert compared 8-byte values, stack and code addresses among them, into inputs), an
# environment of fixed variables (its size moves the stack), and for fuzz_generate one fixed scratch
# folder (the length and bytes of its path reach the target's strings and compares), held under a
# lock by one run at a time.
DET_ENV=()
NO_ASLR=()
if ((DETERMINISTIC)); then
  symbolizer=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
  DET_ENV=(env -i PATH=/usr/bin:/bin ASAN_OPTIONS="$ASAN_OPTIONS" UBSAN_OPTIONS="$UBSAN_OPTIONS")
  if [[ -n $symbolizer ]]; then
    DET_ENV+=(ASAN_SYMBOLIZER_PATH="$symbolizer" UBSAN_SYMBOLIZER_PATH="$symbolizer")
  fi
  if [[ -n ${LD_LIBRARY_PATH:-} ]]; then DET_ENV+=(LD_LIBRARY_PATH="$LD_LIBRARY_PATH"); fi
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    NO_ASLR=("$(command -v setarch)" "$(uname -m)" -R)
  elif [[ $(cat /proc/sys/kernel/randomize_va_space 2>/dev/null) != 0 ]]; then
    echo "fuzz: warning: cannot turn ASLR off (setarch -R): the run may not repeat"
  fi
fi
# Takes the fixed scratch folder of fuzz_generate, waiting while a concurrent run holds it. The lock
# file goes with the folder: whoever gets the lock on a file that was removed meanwhile tries again.
SCRATCH_FIXED=/tmp/patchgen-fuzz-det-$(id -u)
lock_scratch() {
  local lock=$SCRATCH_FIXED.lock tries=0
  while command -v flock >/dev/null && ((tries++ < 100)); do
    if ! { exec 9>>"$lock" && flock -w 600 9; }; then break; fi
    if [[ $lock -ef /dev/fd/9 ]]; then
      SCRATCH=$SCRATCH_FIXED
      LOCKED=1
      rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
      return
    fi
    exec 9>&-
  done
  exec 9>&-
  echo "fuzz: warning: $lock not taken, a temporary scratch folder instead: the run may not repeat"
  SCRATCH=$WORK_DIR/scratch
}
unlock_scratch() {
  rm -rf "$SCRATCH"
  if ((LOCKED)); then rm -f "$SCRATCH.lock"; exec 9>&-; LOCKED=0; fi
}

# libFuzzer's progression (the NEW/REDUCE/INITED/DONE lines) without its timings and RSS; the
# timed `pulse` lines are left out.
progression() {
  grep -E '^#[0-9]+' "$1" | grep -vE '^#[0-9]+\spulse\s' |
    sed -E 's/ exec\/s: [0-9]+//; s/ rss: [0-9]+Mb//' || true
}
digest() {
  progression "$1" | sha256sum | cut -c1-12
}

# Fuzzes target $1 in the run folder $2 (a fresh corpus for --deterministic); 0 if it passed.
fuzz_target() {
  local t=$1 dir=$2
  if ((DETERMINISTIC)); then rm -rf "$dir/corpus"; fi
  mkdir -p "$dir/corpus" "$dir/artifacts"
  ln -sfn "$BUILD_DIR/fuzz/$t" "$dir/$t"
  # The seeds as one sorted list (-seed_inputs; no name has a comma): libFuzzer shuffles and then
  # sorts them by size, so read from folders, the order of same-sized seeds would be the file
  # system's listing order.
  local seeds
  # shellcheck disable=SC2046  # one folder per line, none with spaces
  seeds=$(cd "$dir" && find $(seed_dirs "$t") -type f | LC_ALL=C sort | paste -sd, -)
  printf %s "$seeds" >"$dir/seeds.list"
  # -timeout: one input may take at most 10 s (a hang is a finding); -rss_limit_mb: 2 GB.
  # --deterministic: seed 1 and a fixed run count instead of a time budget; -reload=0 (the corpus
  # folder is re-read every second otherwise, which allocates at times that depend on the clock)
  # and -print_funcs=0 (the names of new functions are symbolized into the heap, source paths
  # included).
  local budget=(-max_total_time="$SECONDS_PER_TARGET")
  ((DETERMINISTIC)) && budget=(-seed=1 -runs="${DET_RUNS[$t]}" -reload=0 -print_funcs=0)
  local env=("${DET_ENV[@]}")
  if ((DETERMINISTIC)) && [[ $t == fuzz_generate ]]; then
    env+=(PATCHGEN_FUZZ_SCRATCH="$SCRATCH")
  fi
  (cd "$dir" && "${env[@]}" "${NO_ASLR[@]}" "./$t" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 \
     -max_len="${MAX_LEN[$t]}" -print_final_stats=1 -artifact_prefix=artifacts/ \
     -seed_inputs=@seeds.list corpus >fuzz.log 2>&1 9>&-)
}

status=0
for t in "${TARGETS[@]}"; do
  dir=$WORK_DIR/$t
  log=$dir/fuzz.log
  if ((DETERMINISTIC)) && [[ $t == fuzz_generate ]]; then lock_scratch; fi
  if fuzz_target "$t" "$dir"; then
    stats=$(grep -E '^(#[0-9]+\s+DONE|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' "$log" |
            tr -s ' \t' ' ' | tr '\n' ' ')
    if ((DETERMINISTIC)); then
      first=$(digest "$log")
      echo "fuzz: $t: ok, seed 1, ${DET_RUNS[$t]} runs: ${stats}progression $first"
      if ((CHECK_REPRO)); then
        if fuzz_target "$t" "$dir.repro" && [[ $(digest "$dir.repro/fuzz.log") == "$first" ]]; then
          echo "fuzz: $t: reproducible: a second run repeated the progression"
        else
          status=1
          CLEAN_WORK=0
          echo "fuzz: $t: NOT reproducible: a second run differs ($log, $dir.repro/fuzz.log):"
          diff <(progression "$log") <(progression "$dir.repro/fuzz.log") | head -6 || true
        fi
      fi
    else
      echo "fuzz: $t: ok, ${SECONDS_PER_TARGET} s: $stats"
    fi
  else
    status=1
    echo "fuzz: $t: FAILED (log: $log, inputs: $dir/artifacts/)"
    grep -E -A30 'patchgen fuzz property violated|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY' "$log" | head -60
    CLEAN_WORK=0
  fi
  if ((DETERMINISTIC)) && [[ $t == fuzz_generate ]]; then unlock_scratch; fi
done

# The generated modules of fuzz_generate's corpus must compile with CPython (where their upstream does).
if [[ " ${TARGETS[*]} " == *" fuzz_generate "* ]]; then
  dump=$WORK_DIR/fuzz_generate/outputs
  rm -rf "$dump" && mkdir -p "$dump"
  # shellcheck disable=SC2046
  (cd "$WORK_DIR/fuzz_generate" && PATCHGEN_FUZZ_DUMP=$dump ./fuzz_generate -runs=0 corpus \
     $(seed_dirs fuzz_generate) >replay.log 2>&1) || {
      status=1; echo "fuzz: fuzz_generate: replay of the corpus failed ($WORK_DIR/fuzz_generate/replay.log)"; CLEAN_WORK=0; }
  if ! "$PYTHON" "$ROOT/fuzz/check_outputs.py" "$dump"; then
    status=1
    CLEAN_WORK=0
  fi
fi

exit $status
