"""Defaults, environment switches and the small tables of GGUF knowledge gguf-mtp relies on.

Facts about the GGUF format itself (value types, quantization block sizes, key names) come from
gguf-py (:mod:`gguf.constants`); this module only holds what gguf-py does not say.
"""

from __future__ import annotations

import os
import re

from gguf.constants import Keys

from .errors import ParameterError

#: The llama.cpp build folder every check runs through (:mod:`gguf_mtp.llama_build`; ``--llama-cpp`` sets it).
ENV_LLAMA_CPP = "GGUF_MTP_LLAMA_CPP"

#: Set to any non-empty value to turn every progress bar off.
ENV_DISABLE_PROGRESS = "GGUF_MTP_DISABLE_PROGRESS"

#: Model KV keys, as gguf-py spells them (``{arch}`` is filled in with ``general.architecture``).
KEY_ARCHITECTURE = Keys.General.ARCHITECTURE
KEY_ALIGNMENT = Keys.General.ALIGNMENT
KEY_BLOCK_COUNT = Keys.LLM.BLOCK_COUNT
KEY_NEXTN_PREDICT_LAYERS = Keys.LLM.NEXTN_PREDICT_LAYERS
KEY_EMBEDDING_LENGTH = Keys.LLM.EMBEDDING_LENGTH
KEY_VOCAB_SIZE = Keys.LLM.VOCAB_SIZE
KEY_SPLIT_NO = Keys.Split.LLM_KV_SPLIT_NO
KEY_SPLIT_COUNT = Keys.Split.LLM_KV_SPLIT_COUNT
KEY_SPLIT_TENSORS_COUNT = Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT
KEY_TOKENS = Keys.Tokenizer.LIST

#: The ``--outtype`` names, in llama-quantize's order of size: its uniform types a head can be written in (the
#: first four also llama.cpp's converter's). The one list: :data:`gguf_mtp.format.quant_rules.HEAD_TYPES` maps each
#: to its ggml type, the command line offers them.
OUTTYPE_NAMES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q4_k", "q3_k", "q2_k",
                                  "q5_1", "q5_0", "q4_1", "q4_0", "iq4_xs", "iq4_nl")

#: Arrays under ``{arch}.`` that are *not* per-layer even when their length happens to equal the
#: block count (a 4-block test model has a 4-entry ``rope.dimension_sections``).
NOT_PER_LAYER_ARRAYS = frozenset(
    {
        "rope.dimension_sections",
        "rope.scaling.factors",
        "attention.sliding_window_pattern_sizes",
        "classifier.output_labels",
    }
)

#: Non-block tensors a llama.cpp ``--mtp`` export or our ``--standalone`` draft carries; compose leaves
#: them out (the composite reuses the trunk's), anything else outside a block is refused.
DRAFT_GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight")

#: unsloth's "shared" sidecars (``mtp-…-shared-Q8_0.gguf``) state this bool, ``true``, and leave out the
#: global tensors they borrow from their target; only unsloth's llama.cpp fork reads it (not b11434).
KEY_NEXTN_SHARED_TARGET_TENSORS = "{arch}.nextn_shared_target_tensors"

#: ``<prefix>-NNNNN-of-NNNNN.gguf``: llama.cpp's split naming (``llama_split_path``), 1-based.
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$")

#: ``blk.N.rest``
BLOCK_TENSOR = re.compile(r"^blk\.(?P<block>[0-9]+)\.(?P<rest>.+)$")

#: Temporary outputs are ``.<final name>.<pid>.partial`` in the output folder.
PARTIAL_SUFFIX = ".partial"

#: Bytes moved per kernel copy call (one progress bar update each).
COPY_CHUNK = 64 * 1024 * 1024

#: Environment variable that overrides :data:`DEFAULT_MAX_HEADER_BYTES` (a plain number of bytes).
ENV_MAX_HEADER_BYTES = "GGUF_MTP_MAX_HEADER_BYTES"

#: The most header bytes gguf-mtp reads before it calls a GGUF header malformed (tokenizers with a
#: quarter million tokens stay far below this).
DEFAULT_MAX_HEADER_BYTES = 512 * 1024 * 1024

#: The largest ``general.alignment`` accepted. llama.cpp only asks for a power of two; real files use
#: 32 (the default) up to a few KiB. Capping it keeps a hostile header from making anything pad (or a
#: ``--dry-run`` allocate) gigabytes.
MAX_ALIGNMENT = 1024 * 1024

#: The most tensors one GGUF file may list. Real models hold a few thousand (experts are stacked into
#: one tensor per block); each entry costs a few hundred bytes of Python objects, so the cap bounds the
#: memory of a hostile tensor table (an absolute ~30 MB) instead of letting it grow with the file.
MAX_TENSORS = 1 << 16


def max_header_bytes() -> int:
    """The header size limit: :data:`ENV_MAX_HEADER_BYTES` if set, else :data:`DEFAULT_MAX_HEADER_BYTES`.

    Read on each call (not at import time) so that a malformed value is one clear error, not a crash
    of every command at start-up.

    Raises:
        ParameterError: the variable is set to something other than a positive whole number of bytes.
    """
    raw = os.environ.get(ENV_MAX_HEADER_BYTES)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_HEADER_BYTES
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise ParameterError(f"{ENV_MAX_HEADER_BYTES}={raw!r} is not a positive whole number of bytes (e.g. 536870912)")
    return int(text)


#: What ``bench`` measures and ``accept`` predicts unless told otherwise: the draft lengths (llama-server's
#: ``--spec-draft-n-max``), the tokens per prompt, and the seconds a server may take to load the model (the command
#: lines' defaults too).
DEFAULT_N_MAX = (1, 2, 3)
DEFAULT_TOKENS = 128
DEFAULT_HEALTH_TIMEOUT = 600.0

#: Seconds one range read of a remote header may take in all, huggingface_hub's retries included, first byte
#: to last (a server trickling a byte every few seconds never trips a per-read timeout), and seconds all
#: reads of one file may take.
ENV_HUB_REQUEST_TIMEOUT = "GGUF_MTP_HUB_REQUEST_TIMEOUT"
ENV_HUB_FILE_TIMEOUT = "GGUF_MTP_HUB_FILE_TIMEOUT"
DEFAULT_HUB_REQUEST_TIMEOUT = 60.0
DEFAULT_HUB_FILE_TIMEOUT = 300.0


def split_file_name(prefix: str, number: int, count: int) -> str:
    """The llama.cpp name of shard ``number`` (1-based) of ``count``."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


def install_hint(extra: str, what: str) -> str:
    """How to install the optional ``extra`` (``llama``, ``bench``): from the clone, since gguf-mtp is not on
    PyPI (``pip install 'gguf-mtp[llama]'`` would fail, or install whoever takes the name)."""
    return f"in your gguf-mtp clone run `make install` or `pip install '.[{extra}]'` ({what})"


def progress_disabled() -> bool:
    """Whether progress bars were turned off globally through :data:`ENV_DISABLE_PROGRESS`."""
    return bool(os.environ.get(ENV_DISABLE_PROGRESS))


def free_cores() -> int:
    """How many CPUs this process may use that are not already busy: the CPUs it may run on
    (``sched_getaffinity``, which a container's or ``taskset``'s limit narrows) less the 1-minute load
    average, at least 1: a thread pool of that size does not oversubscribe a shared machine. Read it once,
    before the work starts: the work's own threads raise the load average it reads."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        load = 0.0
    return max(1, cpus - round(load))
