# patchgen + opslot — top-level entry points.
#   make run    install what is missing, build, generate every spec (example + real models)
#   make test   everything CI checks: unit, ASan/UBSan, golden, CLI, Python, runtime, real models
#               on the CPU against Transformers 5.17.0 and 5.23.0, and the --check drift gate
# Debian packages come from scripts/install-deps.sh; Python packages from PyPI into .venv/
# (scripts/setup-venv.sh, requirements/test.txt, pinned with hashes); upstream Transformers trees
# from PyPI wheels into .upstream/ (scripts/fetch-upstream.py, requirements/upstream.txt).

BUILD        ?= build
BUILD_ASAN   ?= build-asan
BUILD_STATIC ?= build-static
VENV         ?= .venv
PYTHON       := $(VENV)/bin/python
PATCHGEN     := $(BUILD)/tools/patchgen/patchgen
JOBS         ?= $(shell nproc)
UPSTREAM     := .upstream/transformers-5.17.0
# KERNELS=OFF builds without the CUDA kernels (a machine without the CUDA toolkit; opslot's `cuda`
# implementations are then unavailable and say so). Read when the build folder is first configured.
KERNELS      ?= ON
# Real-model specs: their outputs are generated (git-ignored), never committed.
REAL_SPECS   := $(filter-out specs/example/%,$(wildcard specs/*/*.yaml))

.PHONY: all deps venv upstream build kernels test unit-test asan-test fuzz format format-check complexity golden-test cli-test runtime-test \
        models-test check run generate matrix static device-bin gpu-e2e bench clean

all: build

deps:
	@scripts/install-deps.sh

venv:
	@scripts/setup-venv.sh

upstream: venv
	@$(PYTHON) scripts/fetch-upstream.py 5.17.0 5.23.0 >/dev/null

$(BUILD)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPATCHGEN_TEST_PYTHON=$(abspath $(PYTHON)) \
	  -DPATCHGEN_KERNELS=$(KERNELS)

build: deps venv $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# libopslot_kernels.so and libopslot_torch.so (kernels/, kernels/torch/), also copied into the
# runtime package where opslot looks for them,
# with the specs (opslot.auto generates modules from them outside a checkout: docs/auto.md).
kernels: build
	mkdir -p runtime/opslot/_native
	cp $(BUILD)/kernels/libopslot_kernels.so $(BUILD)/kernels/libopslot_torch.so runtime/opslot/_native/
	rm -rf runtime/opslot/_specs && cp -r specs runtime/opslot/_specs

# Everything that tests. Each suite is also a ctest entry, so `ctest --test-dir build` works too.
# The real-model outputs are generated first (they are not committed), the committed example
# outputs are not: the final --check must find them as they were committed.
test: build upstream
	$(PATCHGEN) --diff $(REAL_SPECS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory asan-test
	$(MAKE) --no-print-directory check

unit-test: build
	$(BUILD)/tests/unit_tests

golden-test: build
	ctest --test-dir $(BUILD) --output-on-failure -R golden

cli-test: build
	ctest --test-dir $(BUILD) --output-on-failure -R cli

runtime-test: build
	ctest --test-dir $(BUILD) --output-on-failure -R runtime

# The real-model specs against Transformers 5.17.0 and 5.23.0, on the CPU (tests/models/e2e.py).
models-test: build upstream
	ctest --test-dir $(BUILD) --output-on-failure -R "real_models|hf_parity"

# Unit tests and golden cases under AddressSanitizer + UndefinedBehaviorSanitizer.
asan-test: deps venv
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPATCHGEN_SANITIZE=ON -DPATCHGEN_KERNELS=OFF \
	  -DPATCHGEN_TEST_PYTHON=$(abspath $(PYTHON))
	cmake --build $(BUILD_ASAN) -j $(JOBS) --target unit_tests patchgen
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD_ASAN)/tests/unit_tests
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(PYTHON) tests/golden/run_golden.py --patchgen $(BUILD_ASAN)/tools/patchgen/patchgen

# The fuzz targets (fuzz/, docs/fuzzing.md) for FUZZ_SECONDS each (the `fuzz` ctest suite runs 40 s).
FUZZ_SECONDS ?= 600
fuzz: deps venv
	fuzz/run_fuzz.sh --seconds $(FUZZ_SECONDS) --python $(abspath $(PYTHON)) $(FUZZ_ARGS)

# clang-format over src/, tools/, fuzz/ and kernels/ (.clang-format), and ruff (format, and check with
# its safe fixes) over the Python of runtime/, tests/, bench/, scripts/ and fuzz/ ([tool.ruff] in
# pyproject.toml); `make test` checks both (ctest `format`, scripts/format.sh --check).
format: deps venv
	PYTHON=$(PYTHON) scripts/format.sh

format-check: deps venv
	PYTHON=$(PYTHON) scripts/format.sh --check

# clang-tidy's cognitive complexity (threshold 25) over src/ and tools/, tests excluded (issue #19);
# `make test` checks it too (ctest `complexity`).
complexity: build
	scripts/complexity.sh $(BUILD)

# The drift gate: every spec (example and real models) against what is on disk.
check: build upstream
	$(PATCHGEN) --check

# The main job: generate every spec of this repository (real models against $(UPSTREAM)).
run: build upstream
	$(PATCHGEN) --all --diff

generate: run

# Generation + the CPU real-model test against every release in requirements/upstream.txt;
# writes docs/results/transformers_matrix.md. Does not gate CI.
matrix: build
	$(PYTHON) scripts/fetch-upstream.py --all >/dev/null
	$(PYTHON) tests/models/matrix.py --patchgen $(PATCHGEN) --out docs/results/transformers_matrix.md

# Whole-process timings of patchgen (docs/benchmarks.md); CSV with BENCH_ARGS="--csv out.csv".
bench: build upstream
	$(PYTHON) bench/patchgen_bench.py --patchgen $(PATCHGEN) $(BENCH_ARGS)

# A fully static patchgen for the GPU machine, copied with the kernels' libraries to .device-bin/
# (git-ignored; name it in the device tool's carry).
static: deps venv
	cmake -S . -B $(BUILD_STATIC) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPATCHGEN_STATIC=ON -DPATCHGEN_TESTS=OFF \
	  -DOPSLOT_TORCH_PYTHON=$(abspath $(PYTHON))
	cmake --build $(BUILD_STATIC) -j $(JOBS) --target patchgen opslot_kernels opslot_torch
	mkdir -p .device-bin
	cp $(BUILD_STATIC)/tools/patchgen/patchgen $(BUILD_STATIC)/kernels/libopslot_kernels.so \
	  $(BUILD_STATIC)/kernels/libopslot_torch.so .device-bin/
	ldd .device-bin/patchgen || true

# The GPU machine's inputs within the device tool's 64 MiB carry: `make static`'s patchgen and
# libopslot_torch.so, the kernels' production and bench libraries stripped and xz-packed (about
# half of gzip's size: room for a second library to time side by side), and COMMIT (the commit
# they were built from, "-dirty" with uncommitted changes). On the device machine:
# `source scripts/device-env.sh` unpacks them and sets the variables the runtime reads.
device-bin: static
	cmake --build $(BUILD_STATIC) -j $(JOBS) --target opslot_kernels_bench
	rm -f .device-bin/libopslot_kernels.so* .device-bin/libopslot_kernels_bench.so*
	strip -o .device-bin/libopslot_kernels.so $(BUILD_STATIC)/kernels/libopslot_kernels.so
	strip -o .device-bin/libopslot_kernels_bench.so $(BUILD_STATIC)/kernels/libopslot_kernels_bench.so
	xz -9 -T $(JOBS) -f .device-bin/libopslot_kernels.so .device-bin/libopslot_kernels_bench.so
	git describe --always --dirty > .device-bin/COMMIT
	du -ch .device-bin | tail -1

# GPU end-to-end test of the real-model specs (on the H200 machine, after `make static`).
gpu-e2e:
	tests/models/run_e2e.sh $(E2E_ARGS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_STATIC)
