"""Reading the pipeline's state file (``gguf-mtp-pipeline.json``) back, checked before it is trusted.

The pipeline rewrites the file atomically after every stage, so anything that is not exactly what it
writes -- a directory or a pipe under that name, a file too large, JSON nested too deep, a list
instead of an object, a stage record without its key or with outputs of the wrong types -- was not
written by gguf-mtp (or was edited by hand). It is refused with one line naming the file, rather than
crashing later on a missing key or silently starting over in a folder it cannot prove is its own.

The shape it accepts::

    {"format": 1, "stages": {"<stage>": {"key": "<sha256>", "finished": "<time>",
                                         "outputs": [{"path": str, "size": int, "sha256": "<64 hex>"}],
                                         "detail": {...}}}}
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gguf_mtp.errors import GGUFMTPError
from gguf_mtp.files.json_io import load_json_file

__all__ = ["MAX_STATE_BYTES", "StateFileError", "load_stages"]

#: A state file records a few dozen files; a megabyte-sized one was not written by gguf-mtp.
MAX_STATE_BYTES = 16 * 1024 * 1024

#: The stages of a pipeline run; a record for any other name was not written by gguf-mtp.
STAGES = ("target", "draft", "compose", "verify", "publish")

_SHA256 = re.compile(r"[0-9a-f]{64}")


class StateFileError(GGUFMTPError):
    """The pipeline's state file is not one gguf-mtp wrote."""


def _problem(path: Path, why: str) -> StateFileError:
    return StateFileError(
        f"not a pipeline state file gguf-mtp wrote ({why}); move it away to start the pipeline over", path
    )


def _check_output(path: Path, where: str, output: Any) -> None:
    if not isinstance(output, dict):
        raise _problem(path, f"{where} is not an object")
    if not isinstance(output.get("path"), str) or not output["path"] or "\0" in output["path"]:
        raise _problem(path, f"{where}.path is not a file name")
    size = output.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63:
        raise _problem(path, f"{where}.size is not a byte count")
    if not isinstance(output.get("sha256"), str) or not _SHA256.fullmatch(output["sha256"]):
        raise _problem(path, f"{where}.sha256 is not a sha256")


def _check_record(path: Path, stage: str, record: Any) -> None:
    where = f"stages.{stage}"
    if not isinstance(record, dict):
        raise _problem(path, f"{where} is not an object")
    if not isinstance(record.get("key"), str):
        raise _problem(path, f"{where}.key is not a string")
    outputs = record.get("outputs", [])
    if not isinstance(outputs, list):
        raise _problem(path, f"{where}.outputs is not a list")
    for i, output in enumerate(outputs):
        _check_output(path, f"{where}.outputs[{i}]", output)
    detail = record.get("detail", {})
    if not isinstance(detail, dict):
        raise _problem(path, f"{where}.detail is not an object")
    # The values the pipeline reads back out of a reused record.
    if stage == "target" and not (
        isinstance(detail.get("files"), list) and all(isinstance(f, str) for f in detail["files"])
    ):
        raise _problem(path, f"{where}.detail.files is not a list of file names")
    for key in ("commit", "summary", "repo", "commit_url"):
        if detail.get(key) is not None and not isinstance(detail[key], str):
            raise _problem(path, f"{where}.detail.{key} is not a string")


def load_stages(path: str | os.PathLike[str], state_format: int) -> dict[str, dict[str, Any]]:
    """The finished stages a state file records (``{}`` when there is no file).

    Args:
        path: the state file.
        state_format: the ``format`` value this gguf-mtp writes; a file with another one is refused.

    Raises:
        StateFileError: the file is a directory, pipe or device, too large, not acceptable JSON, or not
            of the shape above; one line naming the file and what is wrong.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return {}
    doc = load_json_file(path, max_bytes=MAX_STATE_BYTES, error=StateFileError,
                         what="not a pipeline state file gguf-mtp wrote")
    if not isinstance(doc, dict):
        raise _problem(path, f"a JSON {type(doc).__name__}, not an object")
    fmt = doc.get("format")
    if isinstance(fmt, bool) or fmt != state_format:
        raise _problem(path, f"format {str(fmt)[:20]!r}, this gguf-mtp writes format {state_format}")
    stages = doc.get("stages")
    if not isinstance(stages, dict):
        raise _problem(path, "no stages object")
    for stage, record in stages.items():
        if stage not in STAGES:
            raise _problem(path, f"unknown stage {stage[:40]!r}")
        _check_record(path, stage, record)
    return stages
