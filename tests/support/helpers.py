"""Independent views of GGUF files for assertions: gguf-py's own GGUFReader, not our parser."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import signal
import sys
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

from gguf import GGUFReader, GGUFValueType

from gguf_mtp.format.layout import PAD_KEY
from gguf_mtp.model.set_id import SET_ID_KEY
from gguf_mtp.model.shards import find_shard_paths

Tensors = dict[str, tuple[int, tuple[int, ...], bytes]]
KVs = dict[str, tuple[list[GGUFValueType], Any]]


def reader_tensors(first: Path) -> Tensors:
    """name -> (ggml type, shape, raw bytes) over every shard, read with gguf-py."""
    out: Tensors = {}
    for path in find_shard_paths(first)[0]:
        out |= _read(path)[0]
    return out


def reader_kvs(path: Path) -> KVs:
    """key -> (types, contents) of one file, read with gguf-py."""
    return copy.deepcopy(_read(path)[1])


#: What gguf-py read, per file content: its reader takes seconds on a 50,000-token vocabulary (one object per
#: token), and the parity tests read each of llama.cpp's converted files several times. Keyed by the bytes'
#: digest, so a file rewritten in place is read again; the oldest go first beyond READ_CACHE_BYTES of files.
_read_cache: OrderedDict[tuple[int, str], tuple[Tensors, KVs]] = OrderedDict()
READ_CACHE_BYTES = 256 << 20


def _read(path: Path) -> tuple[Tensors, KVs]:
    data = Path(path).read_bytes()
    key = (len(data), hashlib.sha256(data).hexdigest())
    cached = _read_cache.get(key)
    if cached is None:
        reader = GGUFReader(path)
        tensors = {t.name: (int(t.tensor_type), tuple(int(d) for d in t.shape),
                            bytes(reader.data[t.data_offset : t.data_offset + t.n_bytes])) for t in reader.tensors}
        kvs = {
            name: (list(field.types), field.contents())
            for name, field in reader.fields.items()
            # compose's own bookkeeping: the padding only places the data (gguf_mtp.format.layout), the set id
            # marks the run that wrote a shard (gguf_mtp.set_id); neither is model metadata
            if not name.startswith("GGUF.") and name not in (PAD_KEY, SET_ID_KEY)
        }
        cached = _read_cache[key] = (tensors, kvs)
        while sum(size for size, _ in _read_cache) > READ_CACHE_BYTES and len(_read_cache) > 1:
            _read_cache.popitem(last=False)
    _read_cache.move_to_end(key)
    return cached


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def copy_model(first: Path, dest: Path) -> Path:
    """Copy every file of a model into ``dest``; returns the copy of ``first``."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in find_shard_paths(first)[0]:
        shutil.copy2(path, dest / path.name)
    return dest / first.name


def shard_files(first: Path) -> list[Path]:
    return find_shard_paths(first)[0]


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def size(path: Path) -> int:
    return os.path.getsize(path)


def rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    set_kvs: dict[str, Any] | None = None,
    drop_tensors: tuple[str, ...] = (),
) -> Path:
    """Copy one GGUF file with some KVs replaced (``key -> KeyValue`` or ``None`` to delete) and some
    tensors left out of the tensor table (their bytes stay as dead space; offsets are unchanged).
    For crafting deliberately broken files in tests."""
    from gguf_mtp.format.header import read_header, serialize_header

    header = read_header(src)
    edits = set_kvs or {}
    kvs = [edits.get(k, kv) if k in edits else kv for k, kv in header.kvs.items()]
    kvs = [kv for kv in kvs if kv is not None]
    kvs += [kv for k, kv in edits.items() if k not in header.kvs and kv is not None]
    tensors = [t for t in header.tensors if t.name not in drop_tensors]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(serialize_header(header.version, kvs, tensors, header.alignment))
        fin.seek(header.data_offset)
        shutil.copyfileobj(fin, fout)
    return dst


@contextmanager
def no_hang(seconds: float = 60) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body runs longer than ``seconds`` — e.g. opening a
    named pipe that has no writer, or a loop over an absurd count."""

    def hung(signum: int, frame: object) -> None:
        raise AssertionError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class LoopbackServer(ThreadingHTTPServer):
    """A test HTTP server that stays silent when a client hangs up mid-response.

    The standard server prints a traceback to stderr for every handler error; a client that
    stops reading on purpose (a refused gzip body, a bounded read) would then leak a traceback
    into the stderr that CLI tests assert on, depending on thread timing.
    """

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def pid_alive(pid: int) -> bool:
    """Whether a process still exists (a zombie counts as gone: it holds no port and no memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def build_llama_tools() -> ModuleType:
    """``scripts/build_llama_tools.py`` as a module (a script, not part of the package)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "build_llama_tools.py"
    spec = importlib.util.spec_from_file_location("build_llama_tools", script)
    assert spec is not None and spec.loader is not None
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    return tools
