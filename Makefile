# Everything a fresh machine needs, idempotently: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gguf-mtp-installed
# llama-cpp-python is built from its sdist (the llama.cpp it vendors is the loader we test against):
# a portable CPU build of the text loader only (no vision/mtmd library, tools or tests), which pip's
# wheel cache then serves to every later install.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[llama,test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m gguf_mtp demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
