"""GLM-5 / 5.1 / 5.2 (``GlmMoeDsaForCausalLM``; BF16 and FP8 releases): the NextN layer (``model.layers.78``) -> one
NextN block of ``glm-dsa``.

The layer is DeepSeek V3.2's (:class:`.deepseek32.DsaMTPModel`: MLA + MoE + DSA indexer), with GLM's differences
(conversion/glm.py, ``GlmMoeDsaModel``): ``rope.dimension_count`` is ``qk_rope_head_dim`` times
``rope_parameters.partial_rotary_factor`` when set; the NextN block's indexer is optional to llama.cpp
(src/models/glm-dsa.cpp, ``TENSOR_NOT_REQUIRED``) and converted when present; and GLM-5.2's
``indexer_types`` (which layers run a full indexer) become ``attention.indexer.types``, an array of the *trunk's*
length: llama.cpp reads it with ``n_layer()`` entries (src/models/glm-dsa.cpp), so it is never extended for the
NextN block (:data:`gguf_mtp.model.arch_rules.ARCH_RULES`) and a draft carries the trunk's entries, as upstream's
``--mtp`` file does. GLM-5's FP8 release keeps ``eh_proj`` in BF16: it passes as it is (:mod:`.fp8`).
"""

from __future__ import annotations

from gguf import MODEL_ARCH, GGUFWriter

from gguf_mtp.errors import CheckpointError

from .base import HeadModel
from .deepseek32 import DsaMTPModel
from .hparams import config_float

__all__ = ["GlmDsaMTPModel"]


@HeadModel.register("GlmMoeDsaForCausalLM")
class GlmDsaMTPModel(DsaMTPModel):
    """MLA + MoE NextN layer with an optional DSA indexer (GLM-5, 5.1, 5.2)."""

    model_arch = MODEL_ARCH.GLM_DSA
    indexer_required = False
    mla_reason = ("llama.cpp's glm-dsa model runs only in MLA format (attention.key_length_mla and attn_k_b/attn_v_b: "
                  "src/models/glm-dsa.cpp:94 'GLM_DSA architecture requires MLA'); reconvert the trunk with a "
                  "current llama.cpp")

    def read_hparams(self) -> None:
        super().read_hparams()
        rope = self.hparams.get("rope_parameters")
        factor = None
        if isinstance(rope, dict):
            factor = config_float(rope, "partial_rotary_factor", where=self.config_path, maximum=1.0, optional=True)
        self.rope_dims = int(self.rope * factor) if factor is not None else self.rope
        types = self.hparams.get("indexer_types")
        if types is not None:
            if not isinstance(types, list) or not all(t in ("full", "shared") for t in types):
                raise CheckpointError('indexer_types is not a list of "full" / "shared"', self.config_path)
            if len(types) != self.n_layer:
                raise CheckpointError(f"indexer_types has {len(types)} entries, num_hidden_layers = {self.n_layer} "
                                      "(llama.cpp reads one per trunk layer: src/models/glm-dsa.cpp:66)",
                                      self.config_path)
        self.indexer_types: list[bool] | None = None if types is None else [t == "full" for t in types]

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        super().set_gguf_parameters(writer, n_layers)
        writer.add_rope_dimension_count(self.rope_dims)
        if self.indexer_types is not None:  # the trunk's length, never extended (glm-dsa.cpp)
            writer.add_array(f"{self.arch}.attention.indexer.types", self.indexer_types)
