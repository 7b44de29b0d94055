"""Compose starts in 0.1 s (issue 33 item 6): a command that copies bytes loads neither numpy nor the rest of
gguf-py, only gguf-py's tables (``gguf.constants``); numpy comes in where values are converted.

Each case runs in a fresh interpreter and reads ``sys.modules`` at its end: what a start-up loads, not how
long it takes (no timing, so a busy machine cannot make it flake).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_mtp.jobs.compose import compose

#: Modules only value conversion needs: numpy, and what gguf-py's ``__init__`` brings (its reader, writer,
#: quantizers; yaml through its metadata); tqdm only for a bar that is shown.
CONVERSION_ONLY = ("numpy", "gguf.gguf_reader", "gguf.gguf_writer", "gguf.quants", "yaml", "tqdm")

#: Runs the CLI in-process (as ``python -m gguf_mtp`` does), then prints its status and which of
#: CONVERSION_ONLY it loaded.
RUN_CLI = """
import json, sys
from gguf_mtp.cli import main
try:
    status = main(sys.argv[2:])
except SystemExit as e:  # --help, --version
    status = e.code
print(json.dumps({"status": status, "loaded": [m for m in json.loads(sys.argv[1]) if m in sys.modules]}))
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GGUF_MTP_DISABLE_PROGRESS": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False,
                          cwd=Path(__file__).parent)


def _cli(*argv: str, watched: tuple[str, ...] = CONVERSION_ONLY) -> dict[str, object]:
    done = _python(RUN_CLI, json.dumps(watched), *argv)
    assert "Traceback" not in done.stderr, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["compose", "--help"]])
def test_plain_start_up_loads_no_numpy_nor_gguf_py(argv: list[str]) -> None:
    # at most gguf-py's tables (the --outtype names sit beside them in gguf_mtp.constants)
    assert _cli(*argv) == {"status": 0, "loaded": []}


def test_compose_copy_path_loads_no_numpy_and_writes_the_same_bytes(
    nemotron_split: Path, nemotron_draftN: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cli"
    result = _cli("compose", str(nemotron_split), str(nemotron_draftN), "-o", str(out), "--no-verify", "--quiet",
                  "--set-kv", "general.name=bench")
    assert result == {"status": 0, "loaded": []}
    # the same composite as this process writes, with numpy and all of gguf-py loaded
    assert "numpy" in sys.modules and "gguf.gguf_writer" in sys.modules
    compose(nemotron_split, nemotron_draftN, tmp_path / "lib", set_kv=["general.name=bench"], progress=False)
    written = _files(out)
    assert len(written) == 3 and written == _files(tmp_path / "lib")


@pytest.mark.parametrize("command", ["strip", "extract", "graft"])
def test_the_other_set_writers_copy_path_loads_no_numpy(
    command: str, composite: Path, nemotron_split: Path, tmp_path: Path
) -> None:
    # issue 41: graft imported verify (and with it numpy) up front, 0.2-0.3 s of every graft's start
    out, first = tmp_path / command, str(next(composite.glob("*-00001-of-*.gguf")))
    argv = {
        "strip": ["strip", first, "-o", str(out)],
        "extract": ["extract", first, "-o", f"{out}.gguf"],
        "graft": ["graft", "--from", first, "--into", str(nemotron_split), "-o", str(out), "--no-verify"],
    }[command]
    assert _cli(*argv, "--quiet") == {"status": 0, "loaded": []}


def test_converting_the_head_loads_numpy(nemotron_split: Path, nemotron_draftN: Path, tmp_path: Path) -> None:
    # the other side of the rule (and proof that the check above sees numpy when it is loaded)
    result = _cli("compose", str(nemotron_split), str(nemotron_draftN), "-o", str(tmp_path / "o"), "--no-verify",
                  "--quiet", "--outtype", "q8_0")
    assert result["status"] == 0 and "numpy" in result["loaded"]  # type: ignore[operator]


DEFERRED = """
import sys
import gguf_mtp
assert "gguf" in sys.modules and "gguf.constants" not in sys.modules and "numpy" not in sys.modules
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys
assert GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K] == (256, 144) and Keys.General.ARCHITECTURE
assert "numpy" not in sys.modules and "gguf.gguf_writer" not in sys.modules
import gguf
assert gguf.constants is sys.modules["gguf.constants"]
from gguf import GGUFReader, GGUFWriter                       # the first other name runs gguf-py's __init__
assert "numpy" in sys.modules and GGUFWriter.__module__ == "gguf.gguf_writer" and GGUFReader
assert gguf.GGUFValueType is GGUFValueType and gguf.quants.dequantize and "GGUFWriter" in dir(gguf)
assert "__getattr__" not in vars(gguf) and not hasattr(gguf, "no_such_name")
print("ok")
"""

INIT_FAILS = """
import sys
import gguf_mtp
sys.modules["numpy"] = None                                   # gguf-py's __init__ cannot import numpy
try:
    from gguf import GGUFWriter
except ImportError:
    pass
else:
    raise AssertionError("imported without numpy")
assert "gguf" not in sys.modules                              # as after any failed import: the next one retries
del sys.modules["numpy"]
import gguf
assert gguf.GGUFWriter and gguf.GGUFValueType is sys.modules["gguf.constants"].GGUFValueType
print("ok")
"""

ALREADY_IMPORTED = """
import gguf
import gguf_mtp
assert "__getattr__" not in vars(gguf) and gguf.GGUFWriter
print("ok")
"""


@pytest.mark.parametrize("code", [DEFERRED, INIT_FAILS, ALREADY_IMPORTED], ids=["deferred", "init-fails", "imported"])
def test_gguf_py_tables_load_alone_and_the_rest_on_first_use(code: str) -> None:
    done = _python(code)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
