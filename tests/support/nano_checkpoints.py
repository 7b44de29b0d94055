"""Tiny Nemotron 3 Nano / 3.5 Lightning checkpoints: ``nemotron_h_moe`` with an MTPv2 head but no latent MoE.

Nano's MoE works at full width: there is no ``fc1_latent_proj`` / ``fc2_latent_proj``, the experts' projections
are ``up_proj [moe_intermediate_size, hidden_size]`` and ``down_proj [hidden_size, moe_intermediate_size]``, and
``config.json`` has no ``moe_latent_size`` (or has it as ``null``). Everything else (names, config keys, the
``mtp.layers.{0,1}`` head) is Nemotron 3 Super's, so these writers reuse
:mod:`gguf_mtp.testing.tiny_checkpoints` and only change the MoE.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from gguf_mtp.testing.tiny_checkpoints import (
    BIAS_SPELLINGS,
    CheckpointTensor,
    mtpv2_config,
    mtpv2_tensors,
    write_checkpoint,
    write_full_mtpv2_checkpoint,
)
from gguf_mtp.testing.tiny_models import TinyHparams

#: How a Nano config states that there is no latent MoE.
LATENT_KEYS = ("absent", "null")
#: Tiny Nano dimensions for the parity tests (GPT-2's tokenizer: 50,257 tokens, padded to 50,264).
NANO_HPARAMS = TinyHparams(n_embd=128, n_vocab=50264, n_head=4, n_head_kv=2, head_dim=32, n_expert=4, n_ff_exp=128,
                           n_ff_shexp=128, moe_latent=128)


def nano_config(hp: TinyHparams, *, trunk_pattern: str = "M*E", latent_key: str = "absent") -> dict[str, object]:
    """NVIDIA's Nemotron-H ``config.json`` keys, without a latent MoE."""
    if latent_key not in LATENT_KEYS:
        raise ValueError(f"latent_key must be one of {LATENT_KEYS}")
    config = mtpv2_config(hp, trunk_pattern=trunk_pattern)
    del config["moe_latent_size"]
    if latent_key == "null":
        config["moe_latent_size"] = None
    return config


def nano_tensors(hp: TinyHparams, *, bias_spelling: str = BIAS_SPELLINGS[0],
                 with_trunk: bool = False) -> list[CheckpointTensor]:
    """The MTPv2 head's tensors without the latent projections, experts at full width."""
    h, f = hp.n_embd, hp.n_ff_exp
    out = []
    for t in mtpv2_tensors(hp, bias_spelling=bias_spelling, with_trunk=with_trunk):
        if "_latent_proj." in t.name:
            continue
        if ".experts." in t.name:
            t = replace(t, shape=(f, h) if t.name.endswith("up_proj.weight") else (h, f))
        out.append(t)
    return out


def write_nano_head_checkpoint(
    out_dir: str | os.PathLike[str], hp: TinyHparams = NANO_HPARAMS, *, files: int = 2,
    bias_spelling: str = BIAS_SPELLINGS[0], latent_key: str = "absent", trunk_pattern: str = "M*E",
) -> Path:
    """An MTPv2 head checkpoint of Nano (config.json + ``mtp.*`` only), in ``files`` shards with an index."""
    config = nano_config(hp, trunk_pattern=trunk_pattern, latent_key=latent_key)
    tensors = nano_tensors(hp, bias_spelling=bias_spelling)
    if files == 1:
        return write_checkpoint(out_dir, config, [tensors], index=False)
    per = -(-len(tensors) // files)
    return write_checkpoint(out_dir, config, [tensors[number * per : (number + 1) * per] for number in range(files)])


def write_full_nano_checkpoint(out_dir: str | os.PathLike[str], hp: TinyHparams = NANO_HPARAMS) -> Path:
    """A complete Nano checkpoint (trunk ``M*E`` + MTPv2 head, one file), the input of llama.cpp's converter.
    The trunk's attention and MoE layers are shaped like the head's two sub-layers. No tokenizer."""
    return write_full_mtpv2_checkpoint(out_dir, nano_config(hp), nano_tensors(hp, with_trunk=True), hp)
