# The two commands README.md starts with. Both set everything up on a fresh machine
# (Python 3.11, no GPU) and are idempotent: re-running only rebuilds what changed.
#   make bench   venv + torch + package with kernels, then the demo and te-bench's quick suite
#   make test    same set-up, then the C++ kernel tests (ctest) and the Python tests (pytest)
#   make gpu-check  on a GPU machine: build in place, device tests, te-bench on the GPU
#   make kernels-test-emulated-avx512  the C++ tests with the avx512 tier (AVX512-BF16 included)
#                run on SIMDe's emulated intrinsics: for a CPU without AVX-512 (not in make test)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
TOOLS_STAMP := $(VENV)/.tools-installed
PACKAGE_STAMP := $(VENV)/.package-installed
CMAKE_BUILD := build/cmake
SOURCES := $(shell find kernels bindings -name '*.cpp' -o -name '*.h') setup.py \
	pyproject.toml CMakeLists.txt

.PHONY: test bench kernels-test kernels-test-emulated-avx512 python-test gpu-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned (the CPU wheel on these machines; an unpinned torch pulls a CUDA build),
# then the build and test tools (pytest-xdist runs the tests in two processes), before our
# extension is built against that torch. matplotlib
# draws te-bench's plots; transformers runs the Hugging Face tests; accelerate, lightning and
# megatron-core are the TE clients of tests/clients/test_accelerate.py, test_lightning.py and
# test_megatron.py. torch==2.13.0 is named beside them so that no dependency replaces it.
# megatron-core 0.19 declares Python >= 3.12 but runs on 3.11, and its declared dependencies are
# only torch, numpy and packaging: --no-deps --ignore-requires-python. triton 3.9.0 is the one
# torch 2.13 pins (Megatron imports it; the GPU kernels will use it).
# None of them is a dependency of the package itself.
$(TOOLS_STAMP): Makefile | $(PY)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q torch==2.13.0 ninja cmake pybind11 numpy pytest pytest-xdist==3.8.0 expecttest \
		matplotlib==3.11.2 transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6
	$(PY) -m pip install -q --no-deps --ignore-requires-python megatron-core==0.19.2 triton==3.9.0
	touch $@

$(PACKAGE_STAMP): $(TOOLS_STAMP) $(SOURCES)
	$(PY) -m pip install -q -e . --no-build-isolation
	touch $@

kernels-test: $(TOOLS_STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake -S . -B $(CMAKE_BUILD) -G Ninja > /dev/null
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake --build $(CMAKE_BUILD) -j 2
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" ctest --test-dir $(CMAKE_BUILD) --output-on-failure

# SIMDe (header-only, from PyPI's simde-py) writes AVX-512 intrinsics in AVX2: the kernel library
# built on it runs its avx512 tier on an AVX2 CPU, so the C++ tests check that tier's code there.
# The AMX tier is not emulated. About 10 minutes on 2 cores: not part of make test.
EMULATED_AVX512_BUILD := build/cmake-emulated-avx512
kernels-test-emulated-avx512: $(TOOLS_STAMP)
	$(PY) -m pip install -q simde-py==0.8.2.post1
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake -S . -B $(EMULATED_AVX512_BUILD) -G Ninja \
		-DTE_KERNELS_SIMDE_INCLUDE="$$($(PY) -c 'import simde_py; print(simde_py.get_include())')" > /dev/null
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake --build $(EMULATED_AVX512_BUILD) -j 2
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" ctest --test-dir $(EMULATED_AVX512_BUILD) --output-on-failure

# Two worker processes (pytest-xdist): most tests are small and bound by Python on one core, so
# two fill the two cores CI has (on 2 Zen 3 cores: 24 minutes in one process, 11-15 in two;
# a fresh clone's make test, build included, 23 minutes).
python-test: $(PACKAGE_STAMP)
	$(PY) -m pytest tests -q -n 2

test: kernels-test python-test

bench: $(PACKAGE_STAMP)
	$(PY) examples/demo.py
	$(VENV)/bin/te-bench

# On a GPU machine whose python3 has a CUDA (or MUSA) PyTorch and Triton: no venv (its torch
# is the CPU wheel); refuses with one line where that python sees no GPU.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py

clean:
	rm -rf build $(VENV) transformer_engine/*.so *.egg-info
