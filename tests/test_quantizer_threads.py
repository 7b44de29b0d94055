"""The quantizer's threads (issue 29, item 14): llama.cpp's quantizer (ggml_quantize_chunk, one call per run of
rows, each on the thread that calls it) runs on a pool sized to the CPUs that are free, not to every CPU: a busy
machine is not oversubscribed."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from gguf_mtp import constants
from gguf_mtp.format import quantize


@pytest.mark.parametrize(("cpus", "load", "free"), [(4, 0.2, 4), (4, 2.6, 1), (4, 9.0, 1), (16, 5.4, 11)])
def test_free_cores_are_the_usable_cpus_less_the_load(monkeypatch: pytest.MonkeyPatch, cpus: int, load: float,
                                                      free: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert constants.free_cores() == free


@pytest.mark.llama  # llama.cpp's own quantizer
@pytest.mark.parametrize(("load", "threads"), [(3.0, 1), (0.0, 4)])
def test_the_quantizer_runs_on_the_free_cores_only(monkeypatch: pytest.MonkeyPatch, load: float,
                                                   threads: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    quantize._ggml_in.cache_clear()
    try:
        ggml = quantize._ggml()
        assert ggml is not None and ggml.threads == threads
        seen: set[int] = set()
        chunk = ggml.quantize_chunk

        def counted(*args: object) -> int:
            seen.add(threading.get_ident())
            return int(chunk(*args))

        monkeypatch.setattr(ggml, "quantize_chunk", counted)
        values = (np.random.default_rng(1).standard_normal((64, 256)) * 0.02).astype(np.float32)
        quantize.from_f32(values, Q.Q4_K)
        assert len(seen) <= threads and ggml.pool._max_workers == threads
    finally:
        quantize._ggml_in.cache_clear()
