"""Synthetic Hugging Face MTP head checkpoints, for the tests, the demo and the benchmark.

:func:`write_mtpv2_checkpoint` writes a folder laid out like NVIDIA's Nemotron-3-Super MTPv2 head:
``config.json`` with the real keys, the real ``mtp.layers.{0,1}.*`` tensor names, sharded
safetensors files and a ``model.safetensors.index.json``. Dimensions come from
:class:`~gguf_mtp.testing.tiny_models.TinyHparams`, so the head fits the tiny targets of
:func:`~gguf_mtp.testing.tiny_models.write_target` built with the same hparams (convert -> compose ->
llama.cpp works), and realistic proportions (512 experts, wide embeddings) give a multi-GB head.

The safetensors files are written here, not with the ``safetensors`` package: its numpy backend
refuses BF16 and it wants every tensor in memory at once; this writer lays out the header first and
then streams one tensor (a bounded run of rows) at a time, so memory stays flat at any size. Every
tensor gets its own seeded values (norms around 1, weights around 0), so a tensor written under the
wrong name is caught by value comparisons.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gguf_mtp.format.safetensors_io import CONFIG_NAME, INDEX_NAME

from .tiny_models import TinyHparams

__all__ = [
    "CheckpointTensor",
    "first_of_layer",
    "mlp_tensors",
    "moe_tensors",
    "mtpv2_config",
    "mtpv2_tensors",
    "shard_names",
    "write_checkpoint",
    "write_config",
    "write_full_mtpv2_checkpoint",
    "write_mtpv2_checkpoint",
    "write_safetensors",
]

DEFAULT_HPARAMS = TinyHparams()

#: ``dtype`` argument -> (safetensors dtype, bytes per element).
_DTYPES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}

#: Elements generated per step while writing one tensor.
_CHUNK_ELEMENTS = 4 * 1024 * 1024

BIAS_SPELLINGS = ("e_score_correction_bias", "e_score_correction.bias")
CONFIG_STYLES = ("pattern", "block_type")
_LETTER_TYPES = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}


@dataclass(frozen=True)
class CheckpointTensor:
    """One tensor to write: name, row-major shape, safetensors dtype, and how to fill it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    fill: str  # "norm" (around 1), "weight" (around 0, small), "bias" (small)

    @property
    def nbytes(self) -> int:
        itemsize = 4 if self.dtype == "F32" else 2
        return int(np.prod(self.shape, dtype=np.int64)) * itemsize


def mtpv2_config(
    hparams: TinyHparams = DEFAULT_HPARAMS, *, trunk_pattern: str = "M*E", dtype: str = "bfloat16",
    config_style: str = "pattern",
) -> dict[str, object]:
    """A Nemotron-H MoE ``config.json`` (NVIDIA's keys) for a head of ``hparams`` on a ``trunk_pattern`` trunk."""
    if config_style not in CONFIG_STYLES:
        raise ValueError(f"config_style must be one of {CONFIG_STYLES}")
    hp = hparams
    config: dict[str, object] = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "torch_dtype": dtype,
        "vocab_size": hp.n_vocab,
        "hidden_size": hp.n_embd,
        "num_hidden_layers": len(trunk_pattern),
        "num_attention_heads": hp.n_head,
        "num_key_value_heads": hp.n_head_kv,
        "head_dim": hp.head_dim,
        "mamba_num_heads": hp.ssm_heads,
        "mamba_head_dim": hp.ssm_head_dim,
        "n_groups": hp.ssm_groups,
        "ssm_state_size": hp.ssm_state,
        "conv_kernel": hp.ssm_conv,
        "n_routed_experts": hp.n_expert,
        "n_shared_experts": 1,
        "moe_intermediate_size": hp.n_ff_exp,
        "moe_shared_expert_intermediate_size": hp.n_ff_shexp,
        "moe_latent_size": hp.moe_latent,
        "num_experts_per_tok": hp.n_expert_used,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 4096,
        "num_nextn_predict_layers": 1,
    }
    if config_style == "pattern":
        config["hybrid_override_pattern"] = trunk_pattern
        config["mtp_hybrid_override_pattern"] = "*E"
    else:
        config["layers_block_type"] = [_LETTER_TYPES[c] for c in trunk_pattern]
        config["mtp_layers_block_type"] = ["attention", "moe"]
    return config


def mtpv2_tensors(
    hparams: TinyHparams = DEFAULT_HPARAMS, *, dtype: str = "bfloat16", bias_spelling: str = BIAS_SPELLINGS[0],
    with_trunk: bool = False,
) -> list[CheckpointTensor]:
    """The tensors of an MTPv2 head (NVIDIA's names and torch shapes), experts interleaved as in the
    real checkpoint (``experts.0.down_proj``, ``experts.0.up_proj``, ``experts.1...``). The routing
    bias is F32, as in NVIDIA's BF16 checkpoint; ``with_trunk`` adds the trunk's embedding, final norm
    and LM head (a full-model checkpoint, of which only the ``mtp.*`` tensors are converted)."""
    if bias_spelling not in BIAS_SPELLINGS:
        raise ValueError(f"bias_spelling must be one of {BIAS_SPELLINGS}")
    hp = hparams
    st = _DTYPES[dtype][0]
    h, q, kv = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    latent, f, s = hp.moe_latent, hp.n_ff_exp, hp.n_ff_shexp
    attn = "mtp.layers.0."
    moe = "mtp.layers.1."
    tensors = [
        CheckpointTensor(attn + "enorm.weight", (h,), st, "norm"),
        CheckpointTensor(attn + "hnorm.weight", (h,), st, "norm"),
        CheckpointTensor(attn + "eh_proj.weight", (h, 2 * h), st, "weight"),
        CheckpointTensor(attn + "norm.weight", (h,), st, "norm"),
        CheckpointTensor(attn + "mixer.q_proj.weight", (q, h), st, "weight"),
        CheckpointTensor(attn + "mixer.k_proj.weight", (kv, h), st, "weight"),
        CheckpointTensor(attn + "mixer.v_proj.weight", (kv, h), st, "weight"),
        CheckpointTensor(attn + "mixer.o_proj.weight", (h, q), st, "weight"),
        CheckpointTensor(moe + "norm.weight", (h,), st, "norm"),
        CheckpointTensor(moe + "mixer.gate.weight", (hp.n_expert, h), st, "weight"),
        CheckpointTensor(moe + f"mixer.gate.{bias_spelling}", (hp.n_expert,), "F32", "bias"),
        CheckpointTensor(moe + "mixer.fc1_latent_proj.weight", (latent, h), st, "weight"),
        CheckpointTensor(moe + "mixer.fc2_latent_proj.weight", (h, latent), st, "weight"),
    ]
    for e in range(hp.n_expert):
        tensors.append(CheckpointTensor(moe + f"mixer.experts.{e}.down_proj.weight", (latent, f), st, "weight"))
        tensors.append(CheckpointTensor(moe + f"mixer.experts.{e}.up_proj.weight", (f, latent), st, "weight"))
    tensors += [
        CheckpointTensor(moe + "mixer.shared_experts.down_proj.weight", (h, s), st, "weight"),
        CheckpointTensor(moe + "mixer.shared_experts.up_proj.weight", (s, h), st, "weight"),
        CheckpointTensor(moe + "final_layernorm.weight", (h,), st, "norm"),
    ]
    if with_trunk:
        tensors = [
            CheckpointTensor("backbone.embeddings.weight", (hp.n_vocab, h), st, "weight"),
            CheckpointTensor("backbone.norm_f.weight", (h,), st, "norm"),
            CheckpointTensor("lm_head.weight", (hp.n_vocab, h), st, "weight"),
            *tensors,
        ]
    return tensors


def _values(tensor: CheckpointTensor, seed: int, index: int) -> Iterator[np.ndarray]:
    """The tensor's values as float32, a bounded chunk at a time (seeded per tensor)."""
    rng = np.random.default_rng([seed, index])
    remaining = int(np.prod(tensor.shape, dtype=np.int64))
    while remaining:
        n = min(remaining, _CHUNK_ELEMENTS)
        values = rng.standard_normal(n, dtype=np.float32)
        if tensor.fill == "norm":
            values = 1.0 + 0.1 * values
        elif tensor.fill == "bias":
            values *= 0.01
        else:
            values *= 0.02
        remaining -= n
        yield values


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return values
    if dtype == "F16":
        return values.astype(np.float16)
    return (values.view(np.uint32) >> 16).astype(np.uint16)  # BF16: the upper 16 bits


def write_safetensors(path: str | os.PathLike[str], tensors: list[CheckpointTensor], *, seed: int = 0,
                      first_index: int = 0) -> None:
    """Write one safetensors file, streaming each tensor's values (the header is laid out first).

    ``first_index`` offsets the per-tensor seeds, so a tensor's values do not depend on its file.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                               "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for i, tensor in enumerate(tensors):
            for chunk in _values(tensor, seed, first_index + i):
                f.write(_encode(chunk, tensor.dtype).tobytes())


def mlp_tensors(prefix: str, n_embd: int, n_ff: int) -> list[CheckpointTensor]:
    """A BF16 gated MLP's ``{prefix}gate_proj`` / ``up_proj`` [n_ff, n_embd] and ``down_proj`` [n_embd, n_ff]."""
    return [CheckpointTensor(prefix + "gate_proj.weight", (n_ff, n_embd), "BF16", "weight"),
            CheckpointTensor(prefix + "up_proj.weight", (n_ff, n_embd), "BF16", "weight"),
            CheckpointTensor(prefix + "down_proj.weight", (n_embd, n_ff), "BF16", "weight")]


def moe_tensors(prefix: str, n_embd: int, n_ff_exp: int, n_expert: int, *, router: str = "gate.weight",
                router_dtype: str = "BF16", bias: str = "gate.e_score_correction_bias", shared: str | None = None,
                n_ff_shexp: int | None = None) -> list[CheckpointTensor]:
    """A DeepSeek-style MoE under ``prefix`` (e.g. ``model.layers.3.mlp.``), in the checkpoints' order: the router
    [n_expert, n_embd], its F32 score-correction ``bias``, each expert's MLP (``experts.{e}.``), then the
    ``shared`` expert's MLP (``n_ff_shexp`` wide, default ``n_ff_exp``) when there is one."""
    tensors = [CheckpointTensor(prefix + router, (n_expert, n_embd), router_dtype, "weight"),
               CheckpointTensor(prefix + bias, (n_expert,), "F32", "bias")]
    for e in range(n_expert):  # interleaved per expert, as in the published checkpoints
        tensors += mlp_tensors(f"{prefix}experts.{e}.", n_embd, n_ff_exp)
    if shared is not None:
        tensors += mlp_tensors(f"{prefix}{shared}.", n_embd, n_ff_shexp or n_ff_exp)
    return tensors


def shard_names(files: int) -> list[str]:
    """Hugging Face's shard file names: ``model-00001-of-0000n.safetensors`` ..."""
    return [f"model-{number:05d}-of-{files:05d}.safetensors" for number in range(1, files + 1)]


def write_config(out: Path, config: dict[str, object]) -> None:
    """Write ``config`` as ``out``'s ``config.json`` (creating ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def first_of_layer(tensors: list[CheckpointTensor], layer: int) -> int:
    """Where ``model.layers.{layer}.`` (a checkpoint's first MTP / NextN layer, after the trunk's) starts in
    ``tensors``: the split of a "trunk in the first shard, the MTP layers in the last" checkpoint."""
    prefix = f"model.layers.{layer}."
    return next(i for i, t in enumerate(tensors) if t.name.startswith(prefix))


def write_checkpoint(
    out_dir: str | os.PathLike[str], config: dict[str, object], shards: list[list[CheckpointTensor]], *,
    names: list[str] | None = None, first_indices: list[int] | None = None, seed: int = 0, index: bool = True,
) -> Path:
    """Write a checkpoint folder: ``config.json``, one safetensors file per group of ``shards`` and (``index``) the
    ``model.safetensors.index.json`` naming each tensor's file; returns the folder.

    ``names``: the files' names (default :func:`shard_names`; one shard without an index: ``model.safetensors``).
    ``first_indices``: each file's first tensor index, which seeds the values (default: the tensors are numbered
    across the files, so a tensor's values do not depend on how the checkpoint is split).
    """
    out = Path(out_dir)
    write_config(out, config)
    if names is None:
        names = ["model.safetensors"] if len(shards) == 1 and not index else shard_names(len(shards))
    if first_indices is None:
        first_indices = [sum(len(group) for group in shards[:number]) for number in range(len(shards))]
    weight_map: dict[str, str] = {}
    for name, group, first in zip(names, shards, first_indices, strict=True):
        write_safetensors(out / name, group, seed=seed, first_index=first)
        weight_map.update({t.name: name for t in group})
    if index:
        total = sum(t.nbytes for group in shards for t in group)
        index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_NAME).write_text(json.dumps(index_doc, indent=2) + "\n", encoding="utf-8")
    return out


def _split(tensors: list[CheckpointTensor], files: int) -> list[list[CheckpointTensor]]:
    """Contiguous groups of about equal bytes, every group non-empty."""
    if files > len(tensors):
        raise ValueError(f"cannot spread {len(tensors)} tensors over {files} files")
    total = sum(t.nbytes for t in tensors)
    groups: list[list[CheckpointTensor]] = [[]]
    done = 0
    for i, tensor in enumerate(tensors):
        unplaced = len(tensors) - i
        unopened = files - len(groups)
        if groups[-1] and unopened and (done >= total * len(groups) / files or unplaced <= unopened):
            groups.append([])
        groups[-1].append(tensor)
        done += tensor.nbytes
    return groups


def write_mtpv2_checkpoint(
    out_dir: str | os.PathLike[str],
    *,
    hparams: TinyHparams = DEFAULT_HPARAMS,
    trunk_pattern: str = "M*E",
    files: int = 2,
    dtype: str = "bfloat16",
    bias_spelling: str = BIAS_SPELLINGS[0],
    config_style: str = "pattern",
    with_trunk: bool = False,
    seed: int = 0,
) -> Path:
    """Write a synthetic NVIDIA-style MTPv2 head checkpoint folder; returns the folder.

    Args:
        out_dir: the folder (created if missing).
        hparams: dimensions; the same as a :func:`~gguf_mtp.testing.tiny_models.write_target` target's.
        trunk_pattern: the trunk's layer pattern the config states (its length is ``num_hidden_layers``).
        files: number of safetensors files (``model-0000k-of-0000n.safetensors`` + index; one file is
            ``model.safetensors`` without an index).
        dtype: ``"bfloat16"`` (NVIDIA's), ``"float16"`` or ``"float32"``; the routing bias is always F32.
        bias_spelling: ``"e_score_correction_bias"`` or ``"e_score_correction.bias"`` (both occur).
        config_style: ``"pattern"`` (``mtp_hybrid_override_pattern: "*E"``) or ``"block_type"``
            (``mtp_layers_block_type: ["attention", "moe"]``).
        with_trunk: also write trunk tensors (embedding, final norm, LM head), alone in the first file,
            like a full-model checkpoint whose first shard holds no MTP tensor.
        seed: seed of the values.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}")
    if files < 1 or (with_trunk and files < 2):
        raise ValueError("files must be >= 1 (>= 2 with_trunk)")
    config = mtpv2_config(hparams, trunk_pattern=trunk_pattern, dtype=dtype, config_style=config_style)
    tensors = mtpv2_tensors(hparams, dtype=dtype, bias_spelling=bias_spelling, with_trunk=with_trunk)
    if files == 1:
        return write_checkpoint(out_dir, config, [tensors], seed=seed, index=False)
    if with_trunk:
        trunk = [t for t in tensors if not t.name.startswith("mtp.")]
        groups = [trunk, *_split(tensors[len(trunk) :], files - 1)]
    else:
        groups = _split(tensors, files)
    return write_checkpoint(out_dir, config, groups, seed=seed)


def mamba_layer_tensors(hparams: TinyHparams, layer: int, dtype: str = "bfloat16") -> list[CheckpointTensor]:
    """The tensors of one Mamba-2 trunk layer of a Nemotron-H checkpoint (HF names and torch shapes)."""
    hp, st = hparams, _DTYPES[dtype][0]
    h, inner, heads = hp.n_embd, hp.ssm_inner, hp.ssm_heads
    conv = inner + 2 * hp.ssm_groups * hp.ssm_state
    pre = f"backbone.layers.{layer}."
    return [
        CheckpointTensor(pre + "norm.weight", (h,), st, "norm"),
        CheckpointTensor(pre + "mixer.in_proj.weight", (inner + conv + heads, h), st, "weight"),
        CheckpointTensor(pre + "mixer.conv1d.weight", (conv, 1, hp.ssm_conv), st, "weight"),
        CheckpointTensor(pre + "mixer.conv1d.bias", (conv,), st, "bias"),
        CheckpointTensor(pre + "mixer.dt_bias", (heads,), "F32", "bias"),
        CheckpointTensor(pre + "mixer.A_log", (heads,), "F32", "bias"),
        CheckpointTensor(pre + "mixer.D", (heads,), "F32", "norm"),
        CheckpointTensor(pre + "mixer.norm.weight", (inner,), st, "norm"),
        CheckpointTensor(pre + "mixer.out_proj.weight", (h, inner), st, "weight"),
    ]


def write_full_nemotron_checkpoint(out_dir: str | os.PathLike[str], hparams: TinyHparams = DEFAULT_HPARAMS) -> Path:
    """Write a complete NemotronH-MoE checkpoint with an MTPv2 head, the input of llama.cpp's own converter.

    The trunk is ``M*E``: a Mamba-2 layer (llama.cpp's hybrid memory needs one recurrent layer to decode), an
    attention layer and a latent-MoE layer shaped like the head's two sub-layers, so ``convert_hf_to_gguf.py``
    makes blocks 0..2 of it and the MTP block ``blk.3``. One safetensors file; a tokenizer is the caller's
    (llama.cpp's converter needs a real one).
    """
    return write_full_mtpv2_checkpoint(out_dir, mtpv2_config(hparams, trunk_pattern="M*E"),
                                       mtpv2_tensors(hparams, with_trunk=True), hparams)


def write_full_mtpv2_checkpoint(out_dir: str | os.PathLike[str], config: dict[str, object],
                                head: list[CheckpointTensor], hparams: TinyHparams) -> Path:
    """A complete Nemotron-H checkpoint of ``config`` (trunk ``M*E``) around the MTPv2 ``head`` (with the trunk's
    embedding, final norm and LM head first), in one ``model.safetensors``: a Mamba-2 layer, then an attention
    and a MoE layer shaped like the head's two sub-layers (their tensors renamed into ``backbone.layers.{1,2}``)."""

    def as_trunk(tensor: CheckpointTensor, prefix: str, layer: int) -> CheckpointTensor:
        return replace(tensor, name=f"backbone.layers.{layer}." + tensor.name[len(prefix) :])

    attention = [t for t in head if t.name.startswith("mtp.layers.0.mixer.") or t.name == "mtp.layers.0.norm.weight"]
    moe = [t for t in head if t.name.startswith("mtp.layers.1.") and not t.name.endswith("final_layernorm.weight")]
    trunk = mamba_layer_tensors(hparams, 0)
    trunk += [as_trunk(t, "mtp.layers.0.", 1) for t in attention] + [as_trunk(t, "mtp.layers.1.", 2) for t in moe]
    return write_checkpoint(out_dir, config, [head[:3] + trunk + head[3:]], index=False)
