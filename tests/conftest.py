"""Shared fixtures: tiny but real models, built once per session (tests never modify them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gguf_mtp.llama_check import llama_cpp_available
from gguf_mtp.tiny_models import GLM4MOE, NEMOTRON_H_MOE, write_draft, write_target

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("GGUF_MTP_DISABLE_PROGRESS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if llama_cpp_available():
        return
    if IN_CI and any("llama" in item.keywords for item in items):
        # In CI the real loader is the judge: a missing llama-cpp-python fails the run, it is not a skip.
        raise pytest.UsageError("CI=true but llama-cpp-python cannot be imported: the llama.cpp tests cannot run")
    skip = pytest.mark.skip(reason="llama-cpp-python is not installed (pip install '.[llama]')")
    for item in items:
        if "llama" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def nemotron_split(models: Path) -> Path:
    """A 3-shard nemotron_h_moe trunk (blocks M,*,E), mixed quant types; path of shard 1."""
    return write_target(models / "split", shards=3, name="Tiny-Nemotron-UD-Q4_K_XL")


@pytest.fixture(scope="session")
def nemotron_metaonly(models: Path) -> Path:
    """3 shards, shard 1 holding only metadata (gguf-split --no-tensor-first-split)."""
    return write_target(models / "metaonly", shards=3, metadata_only_first=True, name="Tiny-Nemotron-meta")


@pytest.fixture(scope="session")
def nemotron_single(models: Path) -> Path:
    """One file, general.alignment = 64, pattern M*EM*E."""
    return write_target(models / "single", pattern="M*EM*E", alignment=64, name="tiny-nemotron-single")


@pytest.fixture(scope="session")
def nemotron_draft0(models: Path) -> Path:
    """An MTP draft at blk.0 carrying token_embd/output_norm/output (like a llama.cpp --mtp export)."""
    return write_draft(models / "drafts" / "mtp-blk0.gguf", block=0, with_globals=True)


@pytest.fixture(scope="session")
def nemotron_draftN(models: Path) -> Path:
    """An MTP draft already at blk.3 (for the M*E trunk), without globals."""
    return write_draft(models / "drafts" / "mtp-blk3.gguf", block="N")


@pytest.fixture(scope="session")
def glm_target(models: Path) -> Path:
    """A 2-shard glm4moe trunk (dense block + MoE block)."""
    return write_target(models / "glm", family=GLM4MOE, shards=2, name="tiny-glm")


@pytest.fixture(scope="session")
def glm_draft(models: Path) -> Path:
    return write_draft(models / "drafts" / "glm-mtp.gguf", family=GLM4MOE, block=0, quant="Q8_0")


__all__ = ["IN_CI", "NEMOTRON_H_MOE"]
