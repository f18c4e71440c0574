# The two commands of the README:
#   make serve   set up (Debian packages, venv, torch CPU, duplex) and run the server on http://127.0.0.1:8000
#   make test    set up (plus test-only packages such as Chromium) and run the whole test suite
# Everything is idempotent: a second run only does what changed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
HOST   ?= 127.0.0.1
PORT   ?= 8000
MODEL  ?= cascade
SERVE_ARGS ?=
PYTEST_ARGS ?=
# llama-cpp-python compiles llama.cpp. Its default (-march=native) build turns on the AMX kernels on CPUs
# that report AMX, and those crash (SIGSEGV in ggml_backend_amx_mul_mat, seen on this project's CI machines,
# where the VM does not grant the AMX tile state). On x86_64 build a portable AVX2 binary instead.
LLAMA_CMAKE ?= $(if $(filter x86_64,$(shell uname -m)),-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON,)

# Debian packages: espeak-ng is the fallback voice and the benchmark's second voice family;
# cmake/g++ build llama-cpp-python; chromium drives the browser tests (test only).
APT_RUN  := espeak-ng libsndfile1 cmake g++
APT_TEST := chromium chromium-driver sox haproxy redis-server

.PHONY: serve test setup setup-test setup-moshi lint typecheck check bench-latency bench-reasoner llama-server clean help

help:
	@echo "make serve   - set up and run the server with the embedded defaults (http://$(HOST):$(PORT))"
	@echo "make test    - set up and run the whole test suite"
	@echo "make lint    - ruff + mypy"
	@echo "make setup-moshi - add the moshi package for --model moshi (make test does it too)"
	@echo "make clean   - remove the virtual environment and caches"

serve: setup
	$(BIN)/duplex serve --host $(HOST) --port $(PORT) --model $(MODEL) $(SERVE_ARGS)

test: setup-test
	$(BIN)/python -m pytest -q --durations=25 $(PYTEST_ARGS)

setup: $(VENV)/.stamp-apt-run $(VENV)/.stamp-deps $(BIN)/llama-server.stamp

# The tests serve a tiny random Moshi (tests/models/test_moshi*.py), so they need the moshi package too.
setup-test: setup $(VENV)/.stamp-apt-test $(VENV)/.stamp-moshi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

check: lint test

$(VENV)/bin/python:
	@echo ">> creating virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.stamp-apt-run: | $(VENV)/bin/python
	@bash .ci/apt.sh $(APT_RUN)
	@touch $@

$(VENV)/.stamp-apt-test: | $(VENV)/bin/python
	@bash .ci/apt.sh $(APT_TEST)
	@touch $@

# torch goes in first and pinned: anything that depends on torch would otherwise pull a multi-GB CUDA
# build. A torch already in the venv (e.g. a CUDA build you installed) is kept.
$(VENV)/.stamp-deps: pyproject.toml | $(VENV)/bin/python
	@$(BIN)/python -c "import torch" 2>/dev/null || { echo ">> installing $(TORCH) (CPU)"; \
		$(BIN)/python -m pip install --progress-bar on "$(TORCH)"; }
	@echo ">> installing duplex and its dependencies (llama-cpp-python builds from source: ~5 min the first time)"
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/python -m pip install --progress-bar on -e ".[dev,llamacpp]"
	@# Smart Turn v3.2 (the cascade's end-of-turn model) is a data file inside pipecat-ai; only that
	@# file is used, so the wheel goes in without its dependencies (numba, loudness, ... not needed).
	$(BIN)/python -m pip install --progress-bar on --no-deps "pipecat-ai==1.14.0"
	@# Face, face mesh and hand models (models/vision/) ship inside mediapipe 0.10.21's wheel (later
	@# releases download them); --no-deps because what it really imports is in pyproject.toml.
	$(BIN)/python -m pip install --progress-bar on --no-deps "mediapipe==0.10.21"
	@# A crash here, not in the middle of a conversation: the embedded reasoner must generate a token.
	$(BIN)/python -m models.background.llamacpp_check
	@touch $@

# llama.cpp's server (the shared background reasoner, models/background/llama_server.py), compiled from the
# llama.cpp sources in the sdist of the llama-cpp-python version just installed: ~6 min on 2 cores the first
# time; the module keeps a binary whose stamp names the same version and flags, so a rerun is instant.
$(BIN)/llama-server.stamp: $(VENV)/.stamp-deps
	@$(BIN)/python -m models.background.llama_server_build --jobs $(shell nproc 2>/dev/null || echo 2)
	@touch $@

llama-server: $(BIN)/llama-server.stamp

# Moshi-family weights (--model moshi, models/moshi/). moshi 0.2.13's metadata pins torch<2.10, numpy<2.3 and
# safetensors<0.8 and pulls sounddevice, bitsandbytes, aiohttp and sphn (its client, quantisation and TTS),
# none of which serving uses; it runs beside torch 2.13 and numpy 2.4 (the tests check it bit for bit against
# its own LMGen). So the package goes in --no-deps, after what it really imports (pyproject's `moshi` extra).
MOSHI ?= moshi==0.2.13
setup-moshi: $(VENV)/.stamp-moshi

$(VENV)/.stamp-moshi: $(VENV)/.stamp-deps
	@echo ">> installing $(MOSHI) (--no-deps) and what it imports: einops, sentencepiece"
	$(BIN)/python -m pip install --progress-bar on -e ".[moshi]"
	$(BIN)/python -m pip install --progress-bar on --no-deps "$(MOSHI)"
	@touch $@

bench-latency: setup
	$(BIN)/python -m bench.latency --sessions 1,32 --seconds 20

# The embedded reasoner, in-process llama.cpp vs llama-server, at 1, 3, 6 and 8 sessions asking at once (a few
# minutes of both cores: run it on a quiet machine).
bench-reasoner: setup
	$(BIN)/python -m bench.reasoner_concurrency --sessions 1,3,6,8

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
