"""A tiny random Qwen3.8-Flash-Next (``qwen4exp``) checkpoint, with the config keys and tensor names llama.cpp
b11434's converter (``conversion/qwen4exp.py``) and loader (``src/models/qwen4exp.cpp``) read.

``Qwen4ExpForCausalLM`` (flat config): 3 ``linear_attention`` (gated delta-net) layers and one ``full_attention``
QSA layer (gated attention plus an indexer whose one ``index_qk_proj`` holds q and k), every layer's norms replaced by
hyper-connections (``attn_hyper_connection`` / ``mlp_hyper_connection``: ``hc_norm``, the low-rank mix and the
inject; the per-stream gammas flat, ``hc x hidden_size``, which llama.cpp loads as ``{n_embd, hc}``), a final
``hyper_connection_mixer`` instead of ``model.norm``, per-expert MoE with a gated shared expert,
and a per-layer-embedding (PLE) n-gram table on layer 1 (two shards, int64 hash constants). Its
``(ngram_size - 1) * heads_per_ngram`` PLE heads are as many as the trunk's blocks, so the
``qwen4exp.ple.head_offsets`` array a full conversion writes is exactly ``block_count`` long: a rule that took every
array as long as the trunk for a per-layer one would extend it when the head block is appended (b11434's
``src/models/qwen4exp.cpp`` reads it per PLE head; ``gguf_mtp.model.arch_rules.NAMED_ONLY``).

The MTP head (top-level ``mtp.*``): ``fc_embedding`` and ``fc_hidden`` (the two halves of upstream's ``eh_proj``),
``pre_fc_norm_embedding`` / ``pre_fc_norm_hidden`` (the latter per hyper-connection stream), its own
``hyper_connection_mixer`` and one full-attention QSA layer. Norm weights are stored zero-centred (Qwen's
``1 + weight``). The trunk is the first safetensors file, the PLE constants the second, the head the third.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gguf_mtp.format.safetensors_io import INDEX_NAME
from gguf_mtp.testing.tiny_checkpoints import CheckpointTensor, write_checkpoint
from support.qwen_checkpoints import DIMS, LAYER_TYPES, N_TRUNK, QwenDims, ffn_tensors, linear_tensors

HC = 2  # hyper-connection streams (hc_count)
HC_LOWRANK = 8
INDEXER_HEADS = 2
INDEXER_DIM = 32
INDEXER_BUDGET = 64
COMPRESS_RATIO = 4
PLE_LAYER = 1  # 0-based; a linear-attention layer, as llama.cpp requires
NGRAM_SIZE = 3
HEADS_PER_NGRAM = 2
PLE_HEADS = (NGRAM_SIZE - 1) * HEADS_PER_NGRAM
PLE_VOCAB_SIZES = (5, 7, 11, 13)
PLE_SHARDS = 2
PLE_CONV_KERNEL = 4
EOS_TOKEN_ID = 50256
PLE_CONSTANTS_FILE = "model-ple-constants.safetensors"

assert PLE_HEADS == N_TRUNK == len(PLE_VOCAB_SIZES)  # the pitfall this fixture is built to hold


def text_config(d: QwenDims = DIMS) -> dict[str, object]:
    """The text model's hyperparameters: every key b11434's converter and loader read for qwen4exp."""
    return {
        "model_type": "qwen4exp",
        "hidden_size": d.n_embd, "num_hidden_layers": N_TRUNK, "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_head_kv, "head_dim": d.head_dim, "vocab_size": d.n_vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attn_output_gate": True,
        "full_attention_interval": 4, "layer_types": LAYER_TYPES, "linear_conv_kernel_dim": d.conv,
        "linear_key_head_dim": d.lin_k_dim, "linear_value_head_dim": d.lin_v_dim,
        "linear_num_key_heads": d.lin_k_heads, "linear_num_value_heads": d.lin_v_heads,
        "num_experts": d.n_expert, "num_experts_per_tok": d.n_expert_used, "moe_intermediate_size": d.n_ff_exp,
        "shared_expert_intermediate_size": d.n_ff_shexp, "norm_topk_prob": True,
        "mtp_num_hidden_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eos_token_id": EOS_TOKEN_ID,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        "hc_count": HC, "hc_lowrank": HC_LOWRANK,
        "indexer_n_heads": INDEXER_HEADS, "indexer_head_dim": INDEXER_DIM, "indexer_budget": INDEXER_BUDGET,
        "indexer_compress_ratio": COMPRESS_RATIO,
        "ple_layer_ids": [PLE_LAYER + 1], "ngram_size": NGRAM_SIZE, "heads_per_ngram": HEADS_PER_NGRAM,
        "ple_conv_kernel_size": PLE_CONV_KERNEL, "split_ngram_parts": PLE_SHARDS,
    }


def config_json(conditional: bool, d: QwenDims = DIMS) -> dict[str, object]:
    """``config.json``: flat for ``Qwen4ExpForCausalLM``, ``text_config``-nested for the release's
    ``Qwen4ExpForConditionalGeneration`` (a Qwen3-VL vision tower beside the text model)."""
    if not conditional:
        return {"architectures": ["Qwen4ExpForCausalLM"], **text_config(d)}
    return {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4exp",
            "text_config": text_config(d), "tie_word_embeddings": False,
            "vision_config": {"depth": 2, "hidden_size": 64, "out_hidden_size": d.n_embd}}


def _t(name: str, shape: tuple[int, ...], fill: str = "weight", dtype: str = "BF16") -> CheckpointTensor:
    return CheckpointTensor(name, shape, dtype, fill)


def mixer_tensors(pre: str, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """A hyper-connection mixer (``pre`` ends with ``.``): per-stream norm gammas and the low-rank mix."""
    hc_dim = HC * d.n_embd
    return [_t(pre + "hc_norm.weight", (HC * d.n_embd,), "bias"),
            _t(pre + "input_mix_weight_down.weight", (HC_LOWRANK, hc_dim)),
            _t(pre + "input_mix_weight_up.weight", (hc_dim, HC_LOWRANK))]


def hyper_connection_tensors(pre: str, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """A layer's two hyper-connection modules (before the token mixer, before the MoE)."""
    out: list[CheckpointTensor] = []
    for module in ("attn_hyper_connection.", "mlp_hyper_connection."):
        out += [*mixer_tensors(pre + module, d), _t(pre + module + "block_inject_weight.weight", (HC, HC * d.n_embd))]
    return out


def qsa_attention_tensors(pre: str, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """A full-attention QSA layer: gated attention (q_proj holds query and gate) and the indexer."""
    h, q, kv = d.n_embd, d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    at = pre + "self_attn."
    return [
        _t(at + "q_proj.weight", (2 * q, h)), _t(at + "k_proj.weight", (kv, h)), _t(at + "v_proj.weight", (kv, h)),
        _t(at + "o_proj.weight", (h, q)), _t(at + "q_norm.weight", (d.head_dim,), "bias"),
        _t(at + "k_norm.weight", (d.head_dim,), "bias"),
        _t(at + "indexer.index_qk_proj.weight", ((INDEXER_HEADS + 1) * INDEXER_DIM, h)),
        _t(at + "indexer.q_layernorm.weight", (INDEXER_DIM,), "bias"),
        _t(at + "indexer.k_layernorm.weight", (INDEXER_DIM,), "bias"),
    ]


def ple_layer_tensors(pre: str, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """The PLE module of the one PLE layer."""
    h, hc_dim = d.n_embd, HC * d.n_embd
    return [_t(pre + "ple.key_proj.weight", (hc_dim, h)), _t(pre + "ple.value_proj.weight", (h, h)),
            _t(pre + "ple.norm_key.weight", (HC * h,), "bias"), _t(pre + "ple.norm_query.weight", (HC * h,), "bias"),
            _t(pre + "ple.norm_conv.weight", (HC * h,), "bias"),
            _t(pre + "ple.conv1d.weight", (hc_dim, 1, PLE_CONV_KERNEL))]


def head_tensors(d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """The MTP head (``mtp.*``), in the order the release's index lists it."""
    h = d.n_embd
    return [
        _t("mtp.fc_embedding.weight", (h, h)), _t("mtp.fc_hidden.weight", (h, h)),
        _t("mtp.pre_fc_norm_embedding.weight", (h,), "bias"),
        _t("mtp.pre_fc_norm_hidden.weight", (HC * h,), "bias"),
        *mixer_tensors("mtp.hyper_connection_mixer.", d),
        *hyper_connection_tensors("mtp.layers.0.", d),
        *qsa_attention_tensors("mtp.layers.0.", d),
        *ffn_tensors("qwen35moe", "mtp.layers.0.", False, d),
    ]


def _without_norms(tensors: list[CheckpointTensor]) -> list[CheckpointTensor]:
    """Qwen3.5's layer less its input/post-attention norms (hyper-connections replace them)."""
    return [t for t in tensors if not t.name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight"))]


def trunk_tensors(model: str = "model.", d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """The trunk under ``model`` (``model.language_model.`` in the ConditionalGeneration layout): embeddings, the
    layers, the PLE table's shards, the final mixer and the LM head."""
    out = [_t(model + "embed_tokens.weight", (d.n_vocab, d.n_embd))]
    for layer, kind in enumerate(LAYER_TYPES):
        pre = f"{model}layers.{layer}."
        out += hyper_connection_tensors(pre, d)
        out += qsa_attention_tensors(pre, d) if kind == "full_attention" else _without_norms(linear_tensors(
            "qwen35", pre, d))
        if layer == PLE_LAYER:
            out += ple_layer_tensors(pre, d)
        out += ffn_tensors("qwen35moe", pre, False, d)
    rows = sum(PLE_VOCAB_SIZES)
    # a row per hash-table entry, as wide as one head's share of the embedding (llama.cpp gathers one row per head
    # and flattens the heads into n_embd: ple_head_dim x ple_n_heads)
    out += [_t(f"{model}ple_embedding.ngram_embedding.shard_{i}.weight",
               (rows // PLE_SHARDS + i * (rows % PLE_SHARDS), d.n_embd // PLE_HEADS)) for i in range(PLE_SHARDS)]
    out += [*mixer_tensors(model + "hyper_connection_mixer.", d), _t("lm_head.weight", (d.n_vocab, d.n_embd))]
    return out


def ple_constants(model: str = "model.") -> dict[str, list[int]]:
    """The PLE hash constants (int64, as the release stores them; 45-bit multipliers do not fit a float)."""
    offsets = [sum(PLE_VOCAB_SIZES[:i]) for i in range(PLE_HEADS)]
    return {f"{model}ple_embedding.layer_multipliers": [(1 << 44) + 7919 * i for i in range(NGRAM_SIZE)],
            f"{model}ple_embedding.ngram_heads_offsets": offsets,
            f"{model}ple_embedding.ngram_heads_vocab_sizes": list(PLE_VOCAB_SIZES)}


def _write_int64_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, values in tensors.items():
        header[name] = {"dtype": "I64", "shape": [len(values)], "data_offsets": [offset, offset + 8 * len(values)]}
        offset += 8 * len(values)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "xb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for values in tensors.values():
            f.write(np.asarray(values, dtype="<i8").tobytes())


def write_qwen4exp_checkpoint(out_dir: Path, d: QwenDims = DIMS, *, conditional: bool = False) -> Path:
    """Write the checkpoint folder (three safetensors files and their index); returns it. ``conditional``: the
    ``Qwen4ExpForConditionalGeneration`` layout (``text_config``, trunk under ``model.language_model.``)."""
    model = "model.language_model." if conditional else "model."
    out = write_checkpoint(out_dir, config_json(conditional, d), [trunk_tensors(model, d), head_tensors(d)],
                           first_indices=[0, 1000])
    constants = ple_constants(model)
    _write_int64_safetensors(out / PLE_CONSTANTS_FILE, constants)
    index = json.loads((out / INDEX_NAME).read_text())
    index["weight_map"] |= {name: PLE_CONSTANTS_FILE for name in constants}
    index["metadata"]["total_size"] += sum(8 * len(v) for v in constants.values())
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return out
