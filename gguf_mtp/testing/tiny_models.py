"""Tiny but real GGUF models for the demo, the tests and the benchmarks.

Each builder writes, through gguf-py's :class:`gguf.GGUFWriter` (the writer llama.cpp's converter
uses), a model that llama.cpp's own loader accepts: a hybrid ``nemotron_h_moe`` trunk (Mamba-2 ``M``,
attention ``*`` and latent-MoE ``E`` blocks) and a ``glm4moe`` trunk, optionally split into shards in
the ``gguf-split`` layout, with quantized tensor types; and the matching MTP drafts with the real
NextN tensor names. Quantized tensors hold random bytes whose fp16 scale fields are set to small
finite values, so ``check_tensors`` passes and one decode step stays finite. No tokenizer is needed
(``tokenizer.ggml.model = "no_vocab"`` plus ``{arch}.vocab_size``, as llama.cpp's own tests do).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    ExpertGatingFuncType,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
)

from gguf_mtp.format.header import KeyValue, encode_kv, read_header, serialize_header

__all__ = [
    "GLM4MOE",
    "NEMOTRON_H_MOE",
    "TinyFamily",
    "TinyHparams",
    "block_tensors",
    "matrix_type",
    "relabel_arch",
    "tensor_role",
    "write_draft",
    "write_shared_sidecar",
    "write_target",
]

Q = GGMLQuantizationType

#: Byte offsets of the fp16 scale fields in one block of each quantized type ggml validates.
_FP16_SCALE_OFFSETS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
}


@dataclass(frozen=True)
class TinyHparams:
    """Dimensions of a tiny model. Widths are multiples of 256 so K-quants and IQ types apply."""

    n_embd: int = 512
    n_vocab: int = 512
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 256  # expert FFN width
    n_ff_shexp: int = 512  # shared expert width
    moe_latent: int = 256  # nemotron latent MoE width
    n_ff_dense: int = 512  # glm4moe leading dense block
    ssm_heads: int = 8
    ssm_head_dim: int = 64
    ssm_groups: int = 2
    ssm_state: int = 32
    ssm_conv: int = 4

    @property
    def ssm_inner(self) -> int:
        return self.ssm_heads * self.ssm_head_dim


#: Matrix roles -> type in the default "mixed" quantization (what a UD quant looks like in miniature).
_MIXED = {
    "token_embd": Q.Q4_K,
    "output": Q.Q6_K,
    "ssm_in": Q.Q8_0,
    "ssm_out": Q.IQ4_XS,
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q8_0,
    "attn_v": Q.Q6_K,
    "attn_output": Q.BF16,
    "ffn_latent_down": Q.BF16,
    "ffn_latent_up": Q.F16,
    "ffn_up_exps": Q.Q4_K,
    "ffn_down_exps": Q.IQ4_XS,
    "ffn_gate_exps": Q.Q4_K,
    "ffn_up_shexp": Q.Q5_K,
    "ffn_down_shexp": Q.Q8_0,
    "ffn_gate_shexp": Q.Q5_K,
    "ffn_up": Q.Q6_K,
    "ffn_down": Q.Q8_0,
    "ffn_gate": Q.Q4_K,
    "nextn.eh_proj": Q.BF16,
}

#: (name suffix, shape in ggml order as a function of the hparams, kind); kind "norm"/"one"/"zero"/
#: "neg"/"small" tensors are F32, "matrix" tensors follow the quantization.
TensorSpec = tuple[str, tuple[str, ...], str]


def _nemotron_block(kind: str) -> list[TensorSpec]:
    attn: list[TensorSpec] = [
        ("attn_q.weight", ("n_embd", "q_width"), "matrix"),
        ("attn_k.weight", ("n_embd", "kv_width"), "matrix"),
        ("attn_v.weight", ("n_embd", "kv_width"), "matrix"),
        ("attn_output.weight", ("q_width", "n_embd"), "matrix"),
    ]
    moe: list[TensorSpec] = [
        ("ffn_gate_inp.weight", ("n_embd", "n_expert"), "small"),
        ("exp_probs_b.bias", ("n_expert",), "zero"),
        ("ffn_latent_down.weight", ("n_embd", "moe_latent"), "matrix"),
        ("ffn_latent_up.weight", ("moe_latent", "n_embd"), "matrix"),
        ("ffn_up_exps.weight", ("moe_latent", "n_ff_exp", "n_expert"), "matrix"),
        ("ffn_down_exps.weight", ("n_ff_exp", "moe_latent", "n_expert"), "matrix"),
        ("ffn_up_shexp.weight", ("n_embd", "n_ff_shexp"), "matrix"),
        ("ffn_down_shexp.weight", ("n_ff_shexp", "n_embd"), "matrix"),
    ]
    norm: list[TensorSpec] = [("attn_norm.weight", ("n_embd",), "one")]
    if kind == "M":
        return [
            *norm,
            ("ssm_in.weight", ("n_embd", "ssm_in_width"), "matrix"),
            ("ssm_conv1d.weight", ("ssm_conv", "conv_width"), "small"),
            ("ssm_conv1d.bias", ("conv_width",), "zero"),
            ("ssm_dt.bias", ("ssm_heads",), "zero"),
            ("ssm_a", ("1", "ssm_heads"), "neg"),
            ("ssm_d", ("1", "ssm_heads"), "one"),
            ("ssm_norm.weight", ("ssm_group_width", "ssm_groups"), "one"),
            ("ssm_out.weight", ("ssm_inner", "n_embd"), "matrix"),
        ]
    if kind == "*":
        return norm + attn
    if kind == "E":
        return norm + moe
    if kind == "nextn":
        return [
            ("nextn.enorm.weight", ("n_embd",), "one"),
            ("nextn.hnorm.weight", ("n_embd",), "one"),
            ("nextn.eh_proj.weight", ("2n_embd", "n_embd"), "matrix"),
            *norm,
            *attn,
            ("post_attention_norm.weight", ("n_embd",), "one"),
            *moe,
            ("nextn.shared_head_norm.weight", ("n_embd",), "one"),
        ]
    raise ValueError(f"unknown nemotron block kind {kind!r}")


def _glm4moe_block(kind: str) -> list[TensorSpec]:
    common = [
        ("attn_norm.weight", ("n_embd",), "one"),
        ("attn_q.weight", ("n_embd", "q_width"), "matrix"),
        ("attn_k.weight", ("n_embd", "kv_width"), "matrix"),
        ("attn_v.weight", ("n_embd", "kv_width"), "matrix"),
        ("attn_output.weight", ("q_width", "n_embd"), "matrix"),
        ("post_attention_norm.weight", ("n_embd",), "one"),
    ]
    moe = [
        ("ffn_gate_inp.weight", ("n_embd", "n_expert"), "small"),
        ("exp_probs_b.bias", ("n_expert",), "zero"),
        ("ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert"), "matrix"),
        ("ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert"), "matrix"),
        ("ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert"), "matrix"),
        ("ffn_gate_shexp.weight", ("n_embd", "n_ff_exp"), "matrix"),
        ("ffn_up_shexp.weight", ("n_embd", "n_ff_exp"), "matrix"),
        ("ffn_down_shexp.weight", ("n_ff_exp", "n_embd"), "matrix"),
    ]
    if kind == "D":
        return [
            *common,
            ("ffn_gate.weight", ("n_embd", "n_ff_dense"), "matrix"),
            ("ffn_up.weight", ("n_embd", "n_ff_dense"), "matrix"),
            ("ffn_down.weight", ("n_ff_dense", "n_embd"), "matrix"),
        ]
    if kind == "E":
        return common + moe
    if kind == "nextn":
        return (
            common
            + moe
            + [
                ("nextn.eh_proj.weight", ("2n_embd", "n_embd"), "matrix"),
                ("nextn.enorm.weight", ("n_embd",), "one"),
                ("nextn.hnorm.weight", ("n_embd",), "one"),
                ("nextn.shared_head_norm.weight", ("n_embd",), "one"),
            ]
        )
    raise ValueError(f"unknown glm4moe block kind {kind!r}")


def _dims(hp: TinyHparams) -> dict[str, int]:
    dims = {name: getattr(hp, name) for name in TinyHparams.__dataclass_fields__}
    dims.update(
        {
            "1": 1,
            "2n_embd": 2 * hp.n_embd,
            "q_width": hp.n_head * hp.head_dim,
            "kv_width": hp.n_head_kv * hp.head_dim,
            "ssm_inner": hp.ssm_inner,
            "ssm_in_width": 2 * hp.ssm_inner + 2 * hp.ssm_groups * hp.ssm_state + hp.ssm_heads,
            "conv_width": hp.ssm_inner + 2 * hp.ssm_groups * hp.ssm_state,
            "ssm_group_width": hp.ssm_inner // hp.ssm_groups,
        }
    )
    return dims


@dataclass(frozen=True)
class TinyFamily:
    """How to build one architecture's tiny model: its blocks and its hyperparameter KVs."""

    arch: str
    default_pattern: str

    def block_specs(self, kind: str) -> list[TensorSpec]:
        return _nemotron_block(kind) if self.arch == NEMOTRON_H_MOE.arch else _glm4moe_block(kind)

    def per_layer(self, pattern: str, hp: TinyHparams) -> dict[str, list[int]]:
        """Per-layer arrays (``{arch}.`` suffix -> values), the NextN block (``"nextn"``) included."""
        if self.arch != NEMOTRON_H_MOE.arch:
            return {}
        kv = [hp.n_head_kv if k in "*" or k == "nextn" else 0 for k in _kinds(pattern)]
        ff = [hp.n_ff_exp if k in "E" or k == "nextn" else 0 for k in _kinds(pattern)]
        return {"attention.head_count_kv": kv, "feed_forward_length": ff}

    def write_hparams(self, writer: GGUFWriter, hp: TinyHparams, n_blocks: int, nextn: int) -> None:
        arch = self.arch
        writer.add_name(f"tiny-{arch}")
        writer.add_block_count(n_blocks)
        writer.add_context_length(4096)
        writer.add_embedding_length(hp.n_embd)
        writer.add_head_count(hp.n_head)
        writer.add_key_length(hp.head_dim)
        writer.add_value_length(hp.head_dim)
        writer.add_vocab_size(hp.n_vocab)
        writer.add_expert_count(hp.n_expert)
        writer.add_expert_used_count(hp.n_expert_used)
        writer.add_expert_feed_forward_length(hp.n_ff_exp)
        writer.add_expert_shared_count(1)
        writer.add_expert_weights_norm(True)
        writer.add_expert_weights_scale(2.5)
        writer.add_layer_norm_rms_eps(1e-5)
        if nextn:
            writer.add_nextn_predict_layers(nextn)
        if arch == NEMOTRON_H_MOE.arch:
            writer.add_layer_norm_eps(1e-5)
            writer.add_expert_shared_feed_forward_length(hp.n_ff_shexp)
            writer.add_moe_latent_size(hp.moe_latent)
            writer.add_ssm_conv_kernel(hp.ssm_conv)
            writer.add_ssm_inner_size(hp.ssm_inner)
            writer.add_ssm_state_size(hp.ssm_state)
            writer.add_ssm_time_step_rank(hp.ssm_heads)
            writer.add_ssm_group_count(hp.ssm_groups)
        else:
            writer.add_head_count_kv(hp.n_head_kv)
            writer.add_feed_forward_length(hp.n_ff_dense)
            writer.add_leading_dense_block_count(1)
            writer.add_rope_dimension_count(hp.head_dim // 2)
            writer.add_rope_freq_base(1_000_000.0)
            writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        writer.add_tokenizer_model("no_vocab")


NEMOTRON_H_MOE = TinyFamily(MODEL_ARCH_NAMES[MODEL_ARCH.NEMOTRON_H_MOE], "M*E")
GLM4MOE = TinyFamily(MODEL_ARCH_NAMES[MODEL_ARCH.GLM4_MOE], "DE")
FAMILIES = {f.arch: f for f in (NEMOTRON_H_MOE, GLM4MOE)}


def _kinds(pattern: str) -> list[str]:
    """Block kinds of a pattern; a trailing ``+`` stands for the NextN block."""
    return [("nextn" if c == "+" else c) for c in pattern]


def matrix_type(role: str, quant: str | GGMLQuantizationType) -> GGMLQuantizationType:
    """The type a matrix of ``role`` (``attn_q``, ``ffn_up_exps``, ...) gets under ``quant``."""
    if quant == "mixed":
        return _MIXED.get(role, Q.Q8_0)
    return Q.__members__[quant] if isinstance(quant, str) else quant


def _quant_payload(shape: Sequence[int], qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """Bytes of a tensor of ggml ``shape`` as ``qtype``, shaped as gguf-py expects for raw data."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    if qtype in (Q.F32, Q.F16, Q.BF16):
        values = rng.standard_normal(rows * shape[0], dtype=np.float32) * 0.02
        if qtype == Q.F32:
            data = values.view(np.uint8)
        elif qtype == Q.F16:
            data = values.astype(np.float16).view(np.uint8)
        else:
            data = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        n_blocks = rows * shape[0] // block_size
        blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        scales = rng.uniform(5e-5, 2e-4, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        for offset in _FP16_SCALE_OFFSETS[qtype]:
            blocks[:, offset : offset + 2] = scales
        data = blocks.reshape(-1)
    return data.reshape(*reversed(shape[1:]), -1)


def _f32_payload(shape: Sequence[int], kind: str, rng: np.random.Generator) -> np.ndarray:
    numpy_shape = tuple(reversed(shape))
    if kind == "one":
        return np.ones(numpy_shape, dtype=np.float32)
    if kind == "zero":
        return np.zeros(numpy_shape, dtype=np.float32)
    if kind == "neg":
        return -np.ones(numpy_shape, dtype=np.float32)
    return (rng.standard_normal(numpy_shape, dtype=np.float32) * 0.02).astype(np.float32)


def _add_tensor(
    writer: GGUFWriter,
    name: str,
    shape: Sequence[int],
    kind: str,
    qtype: GGMLQuantizationType,
    rng: np.random.Generator,
) -> None:
    if kind != "matrix" or qtype == Q.F32:
        writer.add_tensor(name, _f32_payload(shape, "small" if kind == "matrix" else kind, rng))
    else:
        writer.add_tensor(name, _quant_payload(shape, qtype, rng), raw_dtype=qtype)


def block_tensors(family: TinyFamily, kind: str, bid: int, hp: TinyHparams) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape in ggml order, kind) of every tensor of block ``bid`` of ``kind`` (``M``, ``*``, ``E``...)."""
    dims = _dims(hp)
    return [
        (f"blk.{bid}.{suffix}", tuple(dims[d] for d in shape), kind_)
        for suffix, shape, kind_ in family.block_specs(kind)
    ]


def tensor_role(name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``attn_q``."""
    rest = name.split(".", 2)[2] if name.startswith("blk.") else name
    return rest.removesuffix(".weight")


def _write(
    path: Path,
    family: TinyFamily,
    pattern: str,
    hp: TinyHparams,
    *,
    blocks: Sequence[tuple[int, str]],
    globals_: bool,
    quant: str | GGMLQuantizationType,
    shards: int,
    metadata_only_first: bool,
    alignment: int | None,
    seed: int,
    nextn: int,
    per_layer_from: str,
) -> None:
    rng = np.random.default_rng(seed)
    tensors: list[tuple[str, tuple[int, ...], str]] = []
    if globals_:
        tensors.append(("token_embd.weight", (hp.n_embd, hp.n_vocab), "matrix"))
    for bid, kind in blocks:
        tensors += block_tensors(family, kind, bid, hp)
    if globals_:
        tensors.append(("output_norm.weight", (hp.n_embd,), "one"))
        tensors.append(("output.weight", (hp.n_embd, hp.n_vocab), "matrix"))

    per_shard = -(-len(tensors) // (shards - 1 if metadata_only_first else shards)) if shards > 1 else 0
    writer = GGUFWriter(
        path, family.arch, split_max_tensors=per_shard, small_first_shard=metadata_only_first and shards > 1
    )
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    n_blocks = len(per_layer_from)
    family.write_hparams(writer, hp, n_blocks, nextn)
    for suffix, values in family.per_layer(per_layer_from, hp).items():
        writer.add_array(f"{family.arch}.{suffix}", values)
    writer.add_file_type(1)
    for name, shape, kind in tensors:
        _add_tensor(writer, name, shape, kind, matrix_type(tensor_role(name), quant), rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _first_file(path: Path, shards: int) -> Path:
    return path.with_name(f"{path.stem}-00001-of-{shards:05d}.gguf") if shards > 1 else path


def write_target(
    out_dir: str | os.PathLike[str],
    *,
    family: TinyFamily = NEMOTRON_H_MOE,
    name: str | None = None,
    pattern: str | None = None,
    shards: int = 1,
    metadata_only_first: bool = False,
    quant: str | GGMLQuantizationType = "mixed",
    alignment: int | None = None,
    hparams: TinyHparams = TinyHparams(),
    with_nextn: bool = False,
    nextn: int = 1,
    seed: int = 0,
) -> Path:
    """Write a tiny trunk-only (or, with ``with_nextn``, MTP-carrying) model; returns its first file.

    Args:
        out_dir: folder to write into (created if missing).
        family: :data:`NEMOTRON_H_MOE` (pattern of ``M``, ``*``, ``E``) or :data:`GLM4MOE` (``D``, ``E``).
        name: file stem (default ``tiny-<arch>``); shards are ``<name>-0000k-of-0000n.gguf``.
        shards: number of files, split by tensor count in the gguf-split layout.
        metadata_only_first: shard 1 holds only metadata (``gguf-split --no-tensor-first-split``).
        quant: ``"mixed"`` (Q4_K/Q6_K/Q8_0/IQ4_XS/Q5_K/BF16/F16) or one type for every matrix.
        alignment: write ``general.alignment`` (single-file models only; gguf-py pads split shards to it
            but writes the key into shard 1 only).
        with_nextn: append the family's NextN block (a model as llama.cpp's converter writes it with MTP).
        nextn: with ``with_nextn``, how many NextN blocks (Step-3.5 and MiMo-V2 ship 3), in order.
        seed: random seed of the tensor contents.
    """
    if nextn < 1:
        raise ValueError("nextn must be at least 1")
    pattern = pattern or family.default_pattern
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name or 'tiny-' + family.arch}.gguf"
    if alignment is not None and shards > 1:
        raise ValueError("general.alignment is only supported for single-file tiny models")
    full = pattern + ("+" * nextn if with_nextn else "")
    _write(
        path,
        family,
        full,
        hparams,
        blocks=list(enumerate(_kinds(full))),
        globals_=True,
        quant=quant,
        shards=shards,
        metadata_only_first=metadata_only_first,
        alignment=alignment,
        seed=seed,
        nextn=nextn if with_nextn else 0,
        per_layer_from=full,
    )
    return _first_file(path, shards)


def write_draft(
    path: str | os.PathLike[str],
    *,
    family: TinyFamily = NEMOTRON_H_MOE,
    trunk_pattern: str | None = None,
    block: int | str = 0,
    with_globals: bool = False,
    quant: str | GGMLQuantizationType = "BF16",
    hparams: TinyHparams = TinyHparams(),
    alignment: int | None = None,
    nextn: int = 1,
    seed: int = 1,
) -> Path:
    """Write an MTP draft: ``nextn`` NextN blocks from ``blk.0`` or from ``blk.N`` (``block="N"`` means the
    trunk's block count), with per-layer metadata for those blocks, optionally carrying ``token_embd``,
    ``output_norm`` and ``output`` like a llama.cpp ``--mtp`` export.
    """
    if nextn < 1:
        raise ValueError("nextn must be at least 1")
    pattern = trunk_pattern or family.default_pattern
    index = len(pattern) if block == "N" else int(block)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A blk.N draft describes N+k layers (its per-layer arrays have entries for blocks N..N+k-1); blk.0 only k.
    heads = "+" * nextn
    layers = pattern + heads if index == len(pattern) else heads
    if index not in (0, len(pattern)):
        layers = "*" * index + heads
    _write(
        path,
        family,
        layers,
        hparams,
        blocks=[(index + j, "nextn") for j in range(nextn)],
        globals_=with_globals,
        quant=quant,
        shards=1,
        metadata_only_first=False,
        alignment=alignment,
        seed=seed,
        nextn=nextn,
        per_layer_from=layers,
    )
    return path


def write_shared_sidecar(
    path: str | os.PathLike[str],
    *,
    family: TinyFamily = NEMOTRON_H_MOE,
    trunk_pattern: str | None = None,
    quant: str | GGMLQuantizationType = "Q8_0",
    hparams: TinyHparams = TinyHparams(),
    seed: int = 7,
) -> Path:
    """Write a "shared" sidecar as unsloth publishes them (``mtp-…-shared-Q8_0.gguf``), in the tiny family's terms.

    What the published files hold, as far as could be established without them (their headers as read by
    others: a header read of unsloth's ``mtp-Qwen3.8-Flash-Next-shared-Q8_0.gguf`` (32 tensors, against 34 in the
    non-shared ``mtp-…-Q8_0.gguf``), and unsloth's llama.cpp fork, PR #142 "let an MTP draft borrow the target's
    embeddings and lm head"):

    * ``{arch}.nextn_shared_target_tensors``, a GGUF bool, ``true`` (the key is arch-prefixed).
    * the NextN block(s) at their trunk index ``blk.N`` (N = the trunk's block count), ``{arch}.block_count``
      N + 1 and ``{arch}.nextn_predict_layers`` 1, as llama.cpp's ``--mtp`` export writes them.
    * no ``token_embd``, no ``output`` and no ``output_norm``: the fork's converter flag ``--mtp-shared-embd``
      leaves out the three and its loader borrows exactly these names from the target (the qwen4exp file lacks
      two, as qwen4exp has no ``output_norm``). Assumed: an architecture with ``output_norm`` leaves it out too.
    * Assumed: the model KVs of an ``--mtp`` export otherwise, tokenizer included (the converter writes the
      vocabulary for every export); here the tiny models' ``no_vocab`` tokenizer and ``{arch}.vocab_size``.
    """
    draft = write_draft(path, family=family, trunk_pattern=trunk_pattern, block="N", with_globals=False,
                        quant=quant, hparams=hparams, seed=seed)
    add_raw_kvs(draft, [encode_kv(f"{family.arch}.nextn_shared_target_tensors", GGUFValueType.BOOL, True)])
    return draft


def add_raw_kvs(path: str | os.PathLike[str], kvs: Sequence[KeyValue]) -> None:
    """Append ``kvs`` (exact encodings, any type) to a GGUF file's metadata, in place (for fixtures)."""
    path = Path(path)
    header = read_header(path)
    head = serialize_header(header.version, [*header.kvs.values(), *kvs], header.tensors, header.alignment)
    tmp = path.with_name(path.name + ".tmp")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        dst.write(head)
        src.seek(header.data_offset)
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(tmp, path)


def _rekeyed(kv: KeyValue, key: str) -> KeyValue:
    """``kv`` under another key: the same type and value bytes."""
    name = key.encode("utf-8")
    head = struct.pack("<Q", len(name)) + name + struct.pack("<I", kv.vtype)
    return KeyValue(key, kv.vtype, head + kv.raw[kv.value_offset :], len(head))


def relabel_arch(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    arch: str,
    *,
    set_kvs: Sequence[KeyValue] = (),
    drop_keys: Sequence[str] = (),
) -> Path:
    """Copy one tiny GGUF file as a model of another architecture (for fixtures of architectures gguf-py
    cannot build a model of): ``general.architecture`` becomes ``arch``, every ``{old}.*`` key is renamed
    ``{arch}.*`` (values and types kept), then ``drop_keys`` (full new names) are removed and ``set_kvs``
    added or replaced. Tensors and their bytes are copied as they are; ``dst`` is written atomically."""
    src, dst = Path(src), Path(dst)
    header = read_header(src)
    old = header.get("general.architecture")
    assert isinstance(old, str)
    renamed: list[KeyValue] = []
    for key, kv in header.kvs.items():
        if key == "general.architecture":
            renamed.append(encode_kv(key, kv.vtype, arch))
        elif key.startswith(old + "."):
            renamed.append(_rekeyed(kv, arch + key[len(old) :]))
        else:
            renamed.append(kv)
    replaced = {kv.key: kv for kv in set_kvs}
    kvs = [replaced.pop(kv.key, kv) for kv in renamed if kv.key not in drop_keys]
    kvs += list(replaced.values())
    head = serialize_header(header.version, kvs, header.tensors, header.alignment)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        fout.write(head)
        fin.seek(header.data_offset)
        while chunk := fin.read(1 << 20):
            fout.write(chunk)
    os.replace(tmp, dst)
    return dst


def with_hparams(**changes: int) -> TinyHparams:
    """Default tiny hparams with some dimensions changed."""
    return replace(TinyHparams(), **changes)
