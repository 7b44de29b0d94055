"""The pipeline's state file (``gguf-mtp-pipeline.json``): its format, written (:class:`StateFile`) and read back,
checked before it is trusted.

The pipeline rewrites the file atomically after every stage, so anything that is not exactly what it
writes -- a directory or a pipe under that name, a file too large, JSON nested too deep, a list
instead of an object, a stage record without its key or with outputs of the wrong types -- was not
written by gguf-mtp (or was edited by hand). It is refused with one line naming the file, rather than
crashing later on a missing key or silently starting over in a folder it cannot prove is its own.

The whole document is checked against one schema (:func:`check_state`) before any of it is used::

    {"format": 1, "stages": {"<stage>": {"key": str, "finished": str,
                                         "outputs": [{"path": str, "size": int, "sha256": "<64 hex>"}],
                                         "detail": {...}}}}

Every record has all four keys, no key appears twice in any object, no output path twice in a record;
each stage has its number of outputs (target and compose one or more, draft exactly one, verify and
publish none) and its detail fields of their types (:data:`DETAILS`). Anything else is refused with one
line naming the file: the user moves it away to start over (rather than gguf-mtp guessing which parts
of a file it did not write can be trusted).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gguf_mtp.errors import GGUFMTPError
from gguf_mtp.files.digests import FileDigest
from gguf_mtp.files.json_io import load_json_file, write_json_file

__all__ = [
    "DETAILS", "LOCK_NAME", "MAX_OUTPUTS", "MAX_STATE_BYTES", "OUTPUT_COUNTS", "STAGES", "STATE_FORMAT", "STATE_NAME",
    "StateFile", "StateFileError", "check_state", "load_stages", "stage_key",
]

#: A state file records a few dozen files; a megabyte-sized one was not written by gguf-mtp.
MAX_STATE_BYTES = 16 * 1024 * 1024

#: The state file in the work folder, and the format it is written in.
STATE_NAME = "gguf-mtp-pipeline.json"
STATE_FORMAT = 1
#: The lock file of earlier versions (the work folder itself is locked now): still proof of ownership.
LOCK_NAME = ".gguf-mtp-pipeline.lock"
#: The stages of a pipeline run; a record for any other name was not written by gguf-mtp.
STAGES = ("target", "draft", "compose", "verify", "publish")

_SHA256 = re.compile(r"[0-9a-f]{64}")


class StateFileError(GGUFMTPError):
    """The pipeline's state file is not one gguf-mtp wrote."""


def _problem(path: Path, why: str) -> StateFileError:
    return StateFileError(
        f"not a pipeline state file gguf-mtp wrote ({why}); move it away to start the pipeline over", path
    )


#: The most outputs one stage records (a split set has at most 99,999 shards).
MAX_OUTPUTS = 100_000

#: Each stage's detail fields: (kind, required). Kinds: ``text`` (a string), ``text?`` (a string or null),
#: ``names`` (a list of strings), ``count`` (a non-negative integer).
DETAILS: dict[str, dict[str, tuple[str, bool]]] = {
    "target": {"files": ("names", True), "commit": ("text?", False), "repo": ("text?", False)},
    "draft": {"head": ("text", False), "revision": ("text?", False)},
    "compose": {"block": ("count", False), "added": ("count", False)},
    "verify": {"summary": ("text", False), "checks": ("names", False), "llama_cpp": ("text?", False)},
    "publish": {"repo": ("text", False), "commit_url": ("text?", False), "gguf_mtp": ("text", False)},
}

#: How many outputs each stage records: (fewest, most).
OUTPUT_COUNTS: dict[str, tuple[int, int]] = {
    "target": (1, MAX_OUTPUTS),
    "draft": (1, 1),
    "compose": (1, MAX_OUTPUTS),
    "verify": (0, 0),
    "publish": (0, 0),
}

_KINDS: dict[str, tuple[str, Any]] = {
    "text": ("a string", lambda v: isinstance(v, str)),
    "text?": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "names": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "count": ("a count", lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63),
}
_NAMED_KIND = {"files": "a list of file names"}


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


def _check_outputs(path: Path, where: str, record: dict[str, Any]) -> list[Any]:
    """The record's outputs list, each output checked; no file listed twice."""
    if "outputs" not in record:
        raise _problem(path, f"{where} has no outputs list")
    outputs = record["outputs"]
    if not isinstance(outputs, list):
        raise _problem(path, f"{where}.outputs is not a list")
    if len(outputs) > MAX_OUTPUTS:
        raise _problem(path, f"{where}.outputs lists {len(outputs):,} files, more than {MAX_OUTPUTS:,}")
    for i, output in enumerate(outputs):
        _check_output(path, f"{where}.outputs[{i}]", output)
    paths = [o["path"] for o in outputs]
    if len(set(paths)) != len(paths):
        raise _problem(path, f"{where}.outputs lists a file twice")
    return outputs


def _check_detail(path: Path, where: str, stage: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record's detail object, each of its stage's fields of its kind (:data:`DETAILS`)."""
    if "detail" not in record:
        raise _problem(path, f"{where} has no detail object")
    detail = record["detail"]
    if not isinstance(detail, dict):
        raise _problem(path, f"{where}.detail is not an object")
    for name, (kind, required) in DETAILS[stage].items():
        what, fits = _KINDS[kind]
        if (required or name in detail) and not fits(detail.get(name)):
            raise _problem(path, f"{where}.detail.{name} is not {_NAMED_KIND.get(name, what)}")
    return detail


def _check_output_count(path: Path, where: str, stage: str, outputs: list[Any], detail: dict[str, Any]) -> None:
    """The stage's number of outputs (:data:`OUTPUT_COUNTS`); a target names one file per output."""
    fewest, most = OUTPUT_COUNTS[stage]
    if not fewest <= len(outputs) <= most:
        wanted = f"exactly {fewest}" if fewest == most else f"{fewest} or more"
        raise _problem(path, f"{where} records {len(outputs)} outputs; a {stage} stage has {wanted}")
    if stage == "target" and len(detail["files"]) != len(outputs):
        raise _problem(path, f"{where}.detail.files names {len(detail['files'])} files for {len(outputs)} outputs")


def _check_record(path: Path, stage: str, record: Any) -> None:
    where = f"stages.{stage}"
    if not isinstance(record, dict):
        raise _problem(path, f"{where} is not an object")
    if not isinstance(record.get("key"), str):
        raise _problem(path, f"{where}.key is not a string")
    outputs = _check_outputs(path, where, record)
    detail = _check_detail(path, where, stage, record)
    if not isinstance(record.get("finished"), str):
        raise _problem(path, f"{where}.finished is not a time")
    _check_output_count(path, where, stage, outputs, detail)


def check_state(path: Path, doc: Any, state_format: int) -> dict[str, dict[str, Any]]:
    """The stages of a parsed state document, after checking all of it against the schema above.

    Raises:
        StateFileError: the first thing that does not fit, naming ``path`` and the key.
    """
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
                         what="not a pipeline state file gguf-mtp wrote", unique_keys=True)
    return check_state(path, doc, state_format)


# ----------------------------------------------------------------------------------- writing it


def stage_key(stage: str, params: dict[str, Any], inputs: Sequence[FileDigest] = ()) -> str:
    """A stage's identity, recorded as its ``key``: its parameters and the sha256 of its inputs."""
    doc = {"stage": stage, "params": params, "inputs": [[d.name, d.size, d.sha256] for d in inputs]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class StateFile:
    """A work folder's record of finished stages: read checked (:func:`load_stages`), rewritten atomically after
    each change."""

    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / STATE_NAME
        # A state file of any other shape (or a directory, a pipe) is refused with one line: it is not ours.
        self.stages: dict[str, dict[str, Any]] = load_stages(self.path, STATE_FORMAT)

    def record(self, stage: str, key: str, outputs: Sequence[FileDigest], detail: dict[str, Any]) -> None:
        """Record ``stage`` as finished, with its key, outputs and detail fields (:data:`DETAILS`)."""
        self.stages[stage] = {
            "key": key,
            "finished": _now(),
            "outputs": [self._relative(d) for d in outputs],
            "detail": detail,
        }
        self._save()

    def _relative(self, digest: FileDigest) -> dict[str, Any]:
        # Outputs inside the work folder are recorded relative to it, so the folder can be moved.
        entry = digest.to_dict()
        with contextlib.suppress(ValueError):
            entry["path"] = digest.path.resolve().relative_to(self.path.parent.resolve()).as_posix()
        return entry

    def outputs(self, record: dict[str, Any]) -> list[FileDigest]:
        """A record's outputs with their paths resolved."""
        digests = [FileDigest.from_dict(o) for o in record.get("outputs", [])]
        return [FileDigest(self.path.parent / d.path, d.size, d.sha256) for d in digests]

    def forget(self, stage: str) -> None:
        """Drop ``stage``'s record (it no longer holds), rewriting the file only if there was one."""
        if self.stages.pop(stage, None) is not None:
            self._save()

    def _save(self) -> None:
        write_json_file(self.path, {"format": STATE_FORMAT, "stages": self.stages})
