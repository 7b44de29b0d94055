"""DeepSeek V3.2 / V3.2-Exp / Math-V2 (``DeepseekV32ForCausalLM``, FP8): the NextN layer -> one NextN block of
``deepseek32``; and :class:`DsaMTPModel`, what the DeepSeek-Sparse-Attention families (this one and GLM-5.x,
:mod:`.glm_dsa`) add to the ``deepseek2`` head.

A DSA model is DeepSeek V3's (MLA + MoE, the same Hugging Face names and the same ``kv_b_proj`` split,
:class:`.deepseek2.DeepseekV2MTPModel`) plus a "lightning indexer" in every layer, the NextN layer included:
``self_attn.indexer.{wq_b, wk, k_norm (weight and bias), weights_proj}`` -> ``blk.N.indexer.{attn_q_b, attn_k,
k_norm, proj}``, sized by ``index_n_heads`` / ``index_head_dim`` (written as ``attention.indexer.head_count`` /
``key_length``, with ``index_topk`` as ``top_k``: conversion/deepseek.py, ``DeepseekV32Model``). llama.cpp's MTP
graph runs dense MLA and never uses the indexer (src/llama-model.cpp), but the loaders still create the
NextN block's indexer tensors with the block's flags: required by ``deepseek32`` (src/models/deepseek32.cpp),
optional for ``glm-dsa`` (``TENSOR_NOT_REQUIRED``, src/models/glm-dsa.cpp). llama.cpp's converter writes
``indexer.proj`` in F32 (conversion/base.py: "DSA indexer weights should be F32"), as it writes the router.

PyPI gguf 0.19.0 has no ``deepseek32`` architecture: the decoder layer's names come from gguf-py's ``glm-dsa`` table
(the same Hugging Face names, indexer included) and the architecture is written by name.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, GGMLQuantizationType, GGUFWriter

from gguf_mtp.errors import CheckpointError

from .base import CONVERTER_TYPES, HeadModel, TargetCheck
from .deepseek2 import DeepseekV2MTPModel
from .tensors import TensorSource, first_block_template

__all__ = ["DeepseekV32MTPModel", "DsaMTPModel"]

T = MODEL_TENSOR

#: The NextN layer's indexer tensors (suffix after ``model.layers.{N}.``) -> gguf-py tensor and suffix.
INDEXER_TENSORS: dict[str, tuple[MODEL_TENSOR, str]] = {
    "self_attn.indexer.wq_b.weight": (T.INDEXER_ATTN_Q_B, ".weight"),
    "self_attn.indexer.wk.weight": (T.INDEXER_ATTN_K, ".weight"),
    "self_attn.indexer.k_norm.weight": (T.INDEXER_K_NORM, ".weight"),
    "self_attn.indexer.k_norm.bias": (T.INDEXER_K_NORM, ".bias"),
    "self_attn.indexer.weights_proj.weight": (T.INDEXER_PROJ, ".weight"),
}


class DsaMTPModel(DeepseekV2MTPModel):
    """The ``deepseek2`` head plus the NextN layer's DSA indexer (not registered: :class:`DeepseekV32MTPModel`,
    :class:`.glm_dsa.GlmDsaMTPModel`)."""

    #: Whether llama.cpp's loader requires the NextN block's indexer tensors (deepseek32) or takes them when present.
    indexer_required: ClassVar[bool] = True
    #: Where llama.cpp's loader says so (for the refusal).
    indexer_source: ClassVar[str] = ""

    def read_hparams(self) -> None:
        super().read_hparams()
        need = self.hparam_int
        self.index_n_heads = need("index_n_heads")
        self.index_head_dim = need("index_head_dim")
        self.index_topk = need("index_topk", maximum=2**32 - 1)
        present = [suffix for suffix in INDEXER_TENSORS if self.has(suffix)]
        if self.indexer_required and len(present) < len(INDEXER_TENSORS):
            absent = next(self.layer_prefixes[0] + s for s in INDEXER_TENSORS if s not in present)
            raise CheckpointError(f"the NextN layer has no DSA indexer tensor {absent}: llama.cpp's {self.arch} loader "
                                  f"requires the indexer in the NextN block ({self.indexer_source})",
                                  self.checkpoint.folder)
        self.indexer_present = present

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        shapes = super().layer_shapes(block)
        h, heads, dim = self.n_embd, self.index_n_heads, self.index_head_dim
        rows = {T.INDEXER_ATTN_Q_B: (heads * dim, self.q_lora), T.INDEXER_ATTN_K: (dim, h), T.INDEXER_K_NORM: (dim,),
                T.INDEXER_PROJ: (heads, h)}
        indexer = {self.format_tensor_name(key, suffix): rows[key]
                   for s, (key, suffix) in INDEXER_TENSORS.items() if s in self.indexer_present}
        # after the attention, where llama.cpp's loader creates them (before the feed-forward)
        at = list(shapes).index(self.format_tensor_name(T.ATTN_OUT)) + 1
        items = list(shapes.items())
        return dict(items[:at] + list(indexer.items()) + items[at:])

    def output_type(self, name: str, source: TensorSource,
                    outtype: GGMLQuantizationType | None) -> GGMLQuantizationType:
        """As every head's, plus llama.cpp's converter's rule that ``indexer.proj`` is F32."""
        is_proj = first_block_template(name) == self.format_tensor_name(T.INDEXER_PROJ)
        if is_proj and (outtype is None or outtype in CONVERTER_TYPES):
            return GGMLQuantizationType.F32
        return super().output_type(name, source, outtype)

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        super().set_gguf_parameters(writer, n_layers)
        writer.add_indexer_head_count(self.index_n_heads)
        writer.add_indexer_key_length(self.index_head_dim)
        writer.add_indexer_top_k(self.index_topk)

    def target_checks(self) -> list[TargetCheck]:
        return [*super().target_checks(),
                TargetCheck("attention.indexer.head_count", self.index_n_heads, "index_n_heads"),
                TargetCheck("attention.indexer.key_length", self.index_head_dim, "index_head_dim")]


@HeadModel.register("DeepseekV32ForCausalLM")
class DeepseekV32MTPModel(DsaMTPModel):
    """MLA + MoE + DSA indexer NextN layer (DeepSeek V3.2, V3.2-Exp, Math-V2; layer 61)."""

    model_arch = "deepseek32"  # not in PyPI gguf 0.19.0's MODEL_ARCH
    name_table_arch = MODEL_ARCH.GLM_DSA  # the same Hugging Face names, indexer included
    indexer_required = True
    indexer_source = "src/models/deepseek32.cpp:109-114 creates them with the block's flags"
    mla_reason = ("llama.cpp's deepseek32 model runs only in MLA format (attention.key_length_mla and "
                  "attn_k_b/attn_v_b: src/models/deepseek32.cpp:61 'DEEPSEEK32 architecture requires MLA', :499 "
                  "for the MTP graph); reconvert the trunk with a current llama.cpp")
