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

# Said before pip starts, because pip --quiet prints nothing while llama-cpp-python compiles.
define BUILD_NOTICE
	@if ! $(PY) -c 'import llama_cpp' >/dev/null 2>&1; then \
	  echo "gguf-mtp: installing into $(VENV); llama-cpp-python 0.3.36 is built from source with its"; \
	  echo "gguf-mtp: vendored llama.cpp: about 5-8 minutes on 2 cores the first time, with no output meanwhile."; \
	  echo "gguf-mtp: pip caches the wheel, so later installs take seconds."; \
	fi
endef

.PHONY: install demo test lint bench clean

install: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BUILD_NOTICE)
	$(PY) -m pip install --quiet -e '.[llama]'
	touch $@

$(TEST_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BUILD_NOTICE)
	$(PY) -m pip install --quiet -e '.[llama,test,bench]'
	touch $@ $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m gguf_mtp demo

test: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: $(TEST_STAMP)
	$(PY) -m ruff check .

bench: $(TEST_STAMP)
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
