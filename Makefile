# patchgen — top-level entry points. `make` builds, `make test` runs every test, `make run`
# generates the repository's specs (the bundled example always; real models when transformers
# is installed). Dependencies are installed by scripts/install-deps.sh (idempotent).

BUILD        ?= build
BUILD_ASAN   ?= build-asan
BUILD_STATIC ?= build-static
PYTHON       ?= /usr/bin/python3
PATCHGEN     := $(BUILD)/tools/patchgen/patchgen
JOBS         ?= $(shell nproc)

.PHONY: all deps build test unit-test asan-test golden-test cli-test runtime-test check run \
        generate static gpu-e2e bench clean format

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt package-lock.json | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Everything that tests. Each suite is also a ctest entry, so `ctest --test-dir build` works too.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory asan-test
	$(MAKE) --no-print-directory check

unit-test: build
	$(BUILD)/tests/unit_tests

golden-test: build
	ctest --test-dir $(BUILD) --output-on-failure -R golden

cli-test: build
	ctest --test-dir $(BUILD) --output-on-failure -R cli

runtime-test: deps
	cd runtime && $(PYTHON) -m pytest -q tests

# Unit tests and golden cases under AddressSanitizer + UndefinedBehaviorSanitizer.
asan-test: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPATCHGEN_SANITIZE=ON
	cmake --build $(BUILD_ASAN) -j $(JOBS) --target unit_tests patchgen
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD_ASAN)/tests/unit_tests
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(PYTHON) tests/golden/run_golden.py --patchgen $(BUILD_ASAN)/tools/patchgen/patchgen

# The drift gate on the committed example outputs.
check: build
	$(PATCHGEN) --check

# The main job: generate every spec of this repository.
run: build
	$(PATCHGEN) --all --diff

# Every spec, real models included where transformers is on the source path (same job as `run`).
generate: run

# Whole-process timings of patchgen (docs/benchmarks.md); CSV with BENCH_ARGS="--csv out.csv".
# GPU end-to-end test of the real-model specs (on the H200 machine; needs `make static` first,
# whose binary travels in .device-bin/).
gpu-e2e:
	tests/gpu/run_e2e.sh $(E2E_ARGS)

bench: build
	$(PYTHON) bench/patchgen_bench.py --patchgen $(PATCHGEN) $(BENCH_ARGS)

# A fully static binary for the GPU machine, copied to .device-bin/ (git-ignored, carried).
static: deps
	cmake -S . -B $(BUILD_STATIC) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPATCHGEN_STATIC=ON -DPATCHGEN_TESTS=OFF
	cmake --build $(BUILD_STATIC) -j $(JOBS) --target patchgen
	mkdir -p .device-bin && cp $(BUILD_STATIC)/tools/patchgen/patchgen .device-bin/patchgen
	ldd .device-bin/patchgen || true

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_STATIC)
