"""Tiny models llama-server can run: the tiny models of :mod:`gguf_mtp.testing.tiny_models` carry no tokenizer
(``no_vocab``), and llama-server tokenizes prompts and prints tokens. llama.cpp's ``test`` tokenizer needs only a
token list: text is cut into 5-byte chunks hashed to token ids, and a token prints as its id in hex.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf import GGUFValueType

from gguf_mtp.format.header import encode_kv, read_header

from .tiny_models import relabel_arch

__all__ = ["with_test_tokenizer"]


def with_test_tokenizer(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Copy a single-file tiny model (its tensors byte for byte) with llama.cpp's ``test`` tokenizer."""
    header = read_header(src)
    arch = header.get("general.architecture")
    assert isinstance(arch, str)
    n_vocab = header.get(f"{arch}.vocab_size")
    assert isinstance(n_vocab, int)
    tokens = [f"t{i}" for i in range(n_vocab)]
    return relabel_arch(
        src,
        dst,
        arch,
        set_kvs=[
            encode_kv("tokenizer.ggml.model", GGUFValueType.STRING, "test"),
            encode_kv("tokenizer.ggml.tokens", GGUFValueType.ARRAY, tokens, GGUFValueType.STRING),
        ],
    )
