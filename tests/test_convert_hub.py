"""convert from a Hub repo id: only the MTP shards are fetched; offline and token problems are one clear line.

No network: the Hub cache is laid out by hand (``convert_support.fill_hub_cache``) with the tree
listing of every file, so huggingface_hub itself refuses a request for a file that was never
"downloaded"; HTTP answers come from a loopback server started here.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import LocalEntryNotFoundError
from support.convert_support import fill_hub_cache
from support.helpers import LoopbackServer, reader_kvs, reader_tensors
from support.small_disk import PAGE, free_bytes, small_disk

from gguf_mtp.errors import CheckpointError, OutputWriteError, UnsafeOutputError
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

REPO = "nvidia/Tiny-Nemotron-MTPv2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TRUNK_SHARD = "model-00001-of-00003.safetensors"
BLOCK = 3


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A full-model checkpoint whose first shard holds only trunk tensors."""
    return write_mtpv2_checkpoint(tmp_path_factory.mktemp("full") / "repo", files=3, with_trunk=True)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache and HF_HUB_OFFLINE=1 (huggingface_hub reads both at import: patch its constants)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def snapshot_requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Every snapshot_download call's keyword arguments (the real function still runs)."""
    calls: list[dict[str, object]] = []
    real = huggingface_hub.snapshot_download

    def recording(*args: object, **kwargs: object) -> str:
        calls.append(dict(kwargs, args=args))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recording)
    return calls


def test_hub_source_requests_only_config_index_and_mtp_shards(
    full_checkpoint: Path, offline_cache: Path, snapshot_requests: list[dict[str, object]], tmp_path: Path
) -> None:
    fill_hub_cache(offline_cache, REPO, full_checkpoint, leave_out=(TRUNK_SHARD,))
    report = convert(REPO, tmp_path / "draft.gguf", block=BLOCK, progress=False)
    wanted = [
        "config.json",
        "model.safetensors.index.json",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]
    assert [c["allow_patterns"] for c in snapshot_requests] == [wanted]
    assert report.to_dict()["download"]["allow_patterns"] == wanted
    local = convert(full_checkpoint, tmp_path / "local.gguf", block=BLOCK, progress=False).output
    assert reader_tensors(report.output) == reader_tensors(local)
    assert reader_kvs(report.output)["general.name"][1] == "Tiny-Nemotron-MTPv2 MTP head"


def test_hub_cache_in_these_tests_refuses_files_never_downloaded(full_checkpoint: Path, offline_cache: Path) -> None:
    # The guard the test above relies on: asking for the trunk shard fails, so it was never asked for.
    fill_hub_cache(offline_cache, REPO, full_checkpoint, leave_out=(TRUNK_SHARD,))
    try:  # recent huggingface_hub releases refuse an incomplete snapshot; 0.3x and 1.0 return what is cached
        folder = huggingface_hub.snapshot_download(REPO, allow_patterns=["*.safetensors"])
    except LocalEntryNotFoundError:
        return
    assert not (Path(folder) / TRUNK_SHARD).exists()
    assert sorted(p.name for p in Path(folder).glob("*.safetensors"))  # the head shards are there


def test_hub_revision_is_passed_through(
    full_checkpoint: Path, offline_cache: Path, snapshot_requests: list[dict[str, object]], tmp_path: Path
) -> None:
    fill_hub_cache(offline_cache, REPO, full_checkpoint, leave_out=(TRUNK_SHARD,), commit=COMMIT)
    report = convert(REPO, tmp_path / "draft.gguf", block=BLOCK, revision=COMMIT, dry_run=True)
    assert snapshot_requests[0]["revision"] == COMMIT
    assert report.download is not None and report.download.folder.name == COMMIT


def test_hub_index_without_mtp_tensors_is_refused_before_any_shard_download(
    tmp_path: Path, offline_cache: Path, snapshot_requests: list[dict[str, object]]
) -> None:
    folder = write_mtpv2_checkpoint(tmp_path / "repo", files=2)
    index = folder / "model.safetensors.index.json"
    index.write_text(index.read_text().replace('"mtp.', '"backbone.'))
    fill_hub_cache(offline_cache, REPO, folder)
    with pytest.raises(CheckpointError, match="lists no mtp.\\* tensor: this checkpoint has no MTP head"):
        convert(REPO, tmp_path / "draft.gguf", block=BLOCK)
    assert snapshot_requests == []


# -------------------------------------------------------------------- the command line, as users run it


def _run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "convert", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )


def test_cli_offline_with_nothing_cached_is_one_clear_line(tmp_path: Path) -> None:
    done = _run_cli(
        [REPO, "-o", str(tmp_path / "d.gguf"), "--block", "3"], {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "HF_HUB_OFFLINE is set and config.json is not in the Hub cache" in done.stderr


def test_cli_offline_with_a_filled_cache_converts(full_checkpoint: Path, tmp_path: Path) -> None:
    fill_hub_cache(tmp_path / "hf" / "hub", REPO, full_checkpoint, leave_out=(TRUNK_SHARD,))
    done = _run_cli(
        [REPO, "-o", str(tmp_path / "d.gguf"), "--block", "3", "--json"],
        {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "d.gguf").stat().st_size > 0


class _RefusingHub(http.server.BaseHTTPRequestHandler):
    """Answers every request like the Hub answers a private repo to a missing or refused token."""

    status = 401
    error_code = "RepoNotFound"

    def _refuse(self) -> None:
        self.send_response(self.status)
        self.send_header("X-Error-Code", self.error_code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _refuse

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_hub() -> Iterator[tuple[str, type[_RefusingHub]]]:
    handler = type("Handler", (_RefusingHub,), {})
    server = LoopbackServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _hub_env(endpoint: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        **extra,
    }


def test_cli_refused_token_is_one_clear_line(refusing_hub: tuple[str, type], tmp_path: Path) -> None:
    endpoint, _ = refusing_hub
    done = _run_cli(
        [REPO, "-o", str(tmp_path / "d.gguf"), "--block", "3"],
        _hub_env(endpoint, tmp_path, HF_TOKEN="hf_not_a_valid_token"),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert f"repository {REPO} not found, or private and the token was refused" in done.stderr


def test_cli_missing_token_is_one_clear_line(refusing_hub: tuple[str, type], tmp_path: Path) -> None:
    endpoint, _ = refusing_hub
    done = _run_cli([REPO, "-o", str(tmp_path / "d.gguf"), "--block", "3"], _hub_env(endpoint, tmp_path))
    assert done.returncode == 2, done.stderr
    assert "no token is set (set HF_TOKEN)" in done.stderr and done.stderr.count("\n") == 1


def test_cli_gated_repo_is_one_clear_line(refusing_hub: tuple[str, type], tmp_path: Path) -> None:
    endpoint, handler = refusing_hub
    handler.status, handler.error_code = 403, "GatedRepo"
    done = _run_cli([REPO, "-o", str(tmp_path / "d.gguf"), "--block", "3"], _hub_env(endpoint, tmp_path))
    assert done.returncode == 2, done.stderr
    assert f"{REPO} is gated: accept its terms" in done.stderr and done.stderr.count("\n") == 1


# ------------------------------------------- the head by byte ranges, from a loopback Hub (issue 32 item 2)

RANGES_REPO = "deepseek-ai/Tiny-DeepSeek-V3-FP8"


@pytest.fixture(scope="module")
def shared_last_shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DeepSeek V3 FP8 checkpoint (block-scaled weights, their ``weight_scale_inv`` beside them) whose last
    shard holds the NextN layer beside trunk tensors (the last trunk layer, the final norm, the LM head)."""
    from support.deepseek_checkpoints import N_LAYERS, mla_config, mla_tensors
    from support.fp8_checkpoints import quantize_checkpoint

    from gguf_mtp.testing.tiny_checkpoints import first_of_layer, write_checkpoint

    work = tmp_path_factory.mktemp("ranges")
    tensors = mla_tensors("deepseekv3")
    cut = first_of_layer(tensors, N_LAYERS - 1)
    bf16 = write_checkpoint(work / "bf16", mla_config("deepseekv3"), [tensors[:cut], tensors[cut:]])
    return quantize_checkpoint(bf16, work / "fp8")


def _head_and_headers(folder: Path, shard: str, prefix: str) -> tuple[int, int]:
    """(the head tensors' bytes, the header's bytes) of one local shard."""
    from gguf_mtp.format.safetensors_io import SafetensorsFile

    st = SafetensorsFile(folder / shard)
    return sum(t.nbytes for t in st.tensors.values() if t.name.startswith(prefix)), st.data_start


@pytest.fixture
def on_hub(hub: Any, shared_last_shard: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The checkpoint on the loopback Hub; huggingface_hub's downloads in this process go there too, into a
    cache of the test's own (it reads HF_ENDPOINT and HF_HOME once, at import)."""
    import huggingface_hub.file_download

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    reset = getattr(huggingface_hub.utils, "reset_sessions", None)  # 0.x: drop the offline adapter an earlier
    if callable(reset):  # test's session was given
        reset()

    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    if hasattr(huggingface_hub.file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):  # 0.x keeps a copy
        monkeypatch.setattr(huggingface_hub.file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    hub.publish(sorted(p for p in shared_last_shard.iterdir() if p.is_file()), folder="", repo=RANGES_REPO)
    hub.reset()
    return hub


def test_repo_head_is_fetched_by_byte_ranges(on_hub: Any, shared_last_shard: Path, tmp_path: Path) -> None:
    from support.deepseek_checkpoints import N_LAYERS

    last = "model-00002-of-00002.safetensors"
    head, header = _head_and_headers(shared_last_shard, last, f"model.layers.{N_LAYERS}.")
    shard_size = (shared_last_shard / last).stat().st_size
    assert shard_size - head - header > shard_size / 4  # the trunk shares the shard: a download moves it too

    report = convert(RANGES_REPO, tmp_path / "draft.gguf", block=N_LAYERS, progress=False)

    local = convert(shared_last_shard, tmp_path / "local.gguf", block=N_LAYERS, progress=False).output
    assert reader_tensors(report.output) == reader_tensors(local)  # every tensor's bytes
    names = {"general.name"}  # taken from the source's name: the repo's, the folder's
    ranged_kvs, local_kvs = reader_kvs(report.output), reader_kvs(local)
    assert {k: v for k, v in ranged_kvs.items() if k not in names} == {k: v for k, v in local_kvs.items()
                                                                         if k not in names}
    assert ranged_kvs["general.name"][1] == "Tiny-DeepSeek-V3-FP8 MTP head"
    served = on_hub.sent(last)
    assert head + header <= served <= head + header + 2 * 64 * 1024  # the head, its header, joined gaps at most
    assert on_hub.sent("model-00001-of-00002.safetensors") == 0
    fetched = report.to_dict()["download"]
    assert fetched["method"] == "ranges" and fetched["ranges"]["shards"] == [last]
    assert fetched["ranges"]["bytes_fetched"] == served and fetched["ranges"]["shard_bytes"] == shard_size
    assert fetched["ranges"]["commit"] == on_hub.commits[(RANGES_REPO, "main")]
    ranged = [path for _, path, _ in on_hub.requests if path.endswith(last)]
    assert all(f"/resolve/{fetched['ranges']['commit']}/" in path for path in ranged)  # pinned, every one
    assert any(line.startswith("fetched by byte ranges at commit ") for line in report.plan_lines())
    assert not list(tmp_path.glob(".gguf-mtp-head*"))  # the scratch folder is gone


def test_a_dry_run_reads_only_the_headers(on_hub: Any, shared_last_shard: Path, tmp_path: Path) -> None:
    from support.deepseek_checkpoints import N_LAYERS

    last = "model-00002-of-00002.safetensors"
    _, header = _head_and_headers(shared_last_shard, last, f"model.layers.{N_LAYERS}.")
    report = convert(RANGES_REPO, tmp_path / "draft.gguf", block=N_LAYERS, dry_run=True)
    local = convert(shared_last_shard, tmp_path / "draft.gguf", block=N_LAYERS, dry_run=True)
    assert [t.to_dict() for t in report.plan.tensors] == [t.to_dict() for t in local.plan.tensors]
    assert on_hub.sent(last) <= max(header, 64 * 1024) and not (tmp_path / "draft.gguf").exists()


@pytest.mark.slow
def test_a_push_between_ranges_is_one_line(on_hub: Any, shared_last_shard: Path, tmp_path: Path) -> None:
    """A mirror that serves the newest bytes whatever commit is asked for: the change is refused, nothing written."""
    from support.deepseek_checkpoints import N_LAYERS

    last = "model-00002-of-00002.safetensors"
    changed = tmp_path / "changed" / last
    changed.parent.mkdir()
    changed.write_bytes((shared_last_shard / last).read_bytes()[:-1] + b"\x01")
    on_hub.serve_newest = True

    def push(_gets_before: int) -> None:
        shard_gets = [r for r in on_hub.log if r.method == "GET" and r.path.endswith(last)]
        if len(shard_gets) == 2:  # the shard's header answered; its tensor data is asked for next
            on_hub.publish([changed], folder="", repo=RANGES_REPO)

    on_hub.before_get = push
    done = _run_cli([RANGES_REPO, "-o", str(tmp_path / "d.gguf"), "--block", str(N_LAYERS)],
                    _hub_env(on_hub.url, tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "the file changed on the Hub while it was read" in done.stderr
    assert last in done.stderr
    assert not (tmp_path / "d.gguf").exists() and not list(tmp_path.glob(".gguf-mtp-head*"))


def test_a_multi_layer_head_is_fetched_by_ranges(on_hub: Any, tmp_path: Path) -> None:
    """Two NextN layers (a tuple of name prefixes), the last trunk layer beside them in the last shard."""
    from support.deepseek_checkpoints import N_LAYERS, mla_config, mla_tensors

    from gguf_mtp.testing.tiny_checkpoints import first_of_layer, write_checkpoint

    tensors = mla_tensors("glm47flash", n_nextn=2)
    cut = first_of_layer(tensors, N_LAYERS - 1)
    folder = write_checkpoint(tmp_path / "two", mla_config("glm47flash", n_nextn=2), [tensors[:cut], tensors[cut:]])
    repo = "zai-org/Tiny-Two-NextN"
    on_hub.publish(sorted(p for p in folder.iterdir() if p.is_file()), folder="", repo=repo)
    on_hub.reset()
    report = convert(repo, tmp_path / "draft.gguf", block=N_LAYERS, progress=False)
    local = convert(folder, tmp_path / "local.gguf", block=N_LAYERS, progress=False).output
    assert reader_tensors(report.output) == reader_tensors(local) and report.plan.nextn_blocks == 2
    last = "model-00002-of-00002.safetensors"
    head = sum(_head_and_headers(folder, last, f"model.layers.{layer}.")[0] for layer in (N_LAYERS, N_LAYERS + 1))
    header = _head_and_headers(folder, last, "-")[1]
    assert head + header <= on_hub.sent(last) <= head + header + 2 * 64 * 1024 < (folder / last).stat().st_size


# ------------------------------------------- the head's scratch: free space, a full disk, signals (issue 37)

LAST = "model-00002-of-00002.safetensors"


def _before_the_head_data(hub: Any, act: Any) -> None:
    """Run ``act()`` once, when the last shard's header has been answered and its tensor data is asked for next."""
    def hook(_gets_before: int) -> None:
        shard_gets = [r for r in hub.log if r.method == "GET" and r.path.endswith(LAST)]
        if len(shard_gets) == 2:
            act()

    hub.before_get = hook


def _assert_one_free_space_line(error: BaseException, disk: Path) -> None:
    """One line naming the folder, the head, and the bytes needed and free."""
    message = str(error)
    assert "\n" not in message and message.startswith(f"{disk}: not enough free space for the head of {RANGES_REPO}")
    assert "needed (" in message and "free (" in message


def test_a_head_larger_than_the_free_space_is_refused_before_its_bytes_are_fetched(
    on_hub: Any, shared_last_shard: Path, tmp_path: Path
) -> None:
    from support.deepseek_checkpoints import N_LAYERS

    head, header = _head_and_headers(shared_last_shard, LAST, f"model.layers.{N_LAYERS}.")
    with small_disk(tmp_path / "disk", max(head // 2, 16 * PAGE)) as disk:
        assert free_bytes(disk) < head
        with pytest.raises(UnsafeOutputError) as refused:
            convert(RANGES_REPO, disk / "draft.gguf", block=N_LAYERS, progress=False)
        left = os.listdir(disk)
    _assert_one_free_space_line(refused.value, disk)
    assert on_hub.sent(LAST) <= max(header, 64 * 1024)  # its header, not its tensors
    assert left == []  # the scratch folder is gone


def test_a_disk_that_fills_during_the_fetch_is_one_line_and_leaves_no_scratch(
    on_hub: Any, shared_last_shard: Path, tmp_path: Path
) -> None:
    from support.deepseek_checkpoints import N_LAYERS

    head, _ = _head_and_headers(shared_last_shard, LAST, f"model.layers.{N_LAYERS}.")
    with small_disk(tmp_path / "disk", 2 * head) as disk:  # room for the head, until someone else takes it
        filler = disk / "someone-elses-file"
        _before_the_head_data(on_hub, lambda: filler.write_bytes(b"x" * free_bytes(disk)))
        with pytest.raises(OutputWriteError) as failed:
            convert(RANGES_REPO, disk / "draft.gguf", block=N_LAYERS, progress=False)
        left = os.listdir(disk)
    _assert_one_free_space_line(failed.value, disk)
    assert left == ["someone-elses-file"]


def test_the_scratch_goes_beside_an_output_folder_still_to_be_made(on_hub: Any, tmp_path: Path) -> None:
    from support.deepseek_checkpoints import N_LAYERS

    seen: list[Path] = []
    _before_the_head_data(on_hub, lambda: seen.extend(tmp_path.glob(".gguf-mtp-head*")))
    report = convert(RANGES_REPO, tmp_path / "new" / "draft.gguf", block=N_LAYERS, progress=False)
    assert len(seen) == 1 and seen[0].parent == tmp_path  # the nearest folder there is, on the output's disk
    assert report.output.is_file() and not list(tmp_path.glob(".gguf-mtp-head*"))


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_the_fetch_removes_the_scratch(signal_name: str, on_hub: Any, tmp_path: Path) -> None:
    from support.deepseek_checkpoints import N_LAYERS

    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env |= _hub_env(on_hub.url, tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "gguf_mtp", "convert", RANGES_REPO, "-o", str(out / "d.gguf"),
                              "--block", str(N_LAYERS)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    scratch: list[Path] = []

    def interrupt() -> None:  # the server answers only once the signal is sent: mid-fetch, every time
        scratch.extend(out.glob(".gguf-mtp-head*"))
        child.send_signal(getattr(signal, signal_name))

    _before_the_head_data(on_hub, interrupt)
    _, stderr = child.communicate()
    assert scratch  # it was there when the signal came
    assert child.returncode == 130 and stderr == "gguf-mtp: interrupted; no output was left behind\n", stderr
    assert os.listdir(out) == []
