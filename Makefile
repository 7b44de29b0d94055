# Everything a fresh machine needs, idempotently: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gguf-mtp-installed
# llama-cpp-python is built from its sdist (the llama.cpp it vendors is the loader we test against);
# a portable CPU build, so pip's wheel cache can serve later runs on other machines too.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

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
