"""inspect hf://...: only header bytes cross the network, fetched with HTTP range requests.

A loopback server stands in for the Hub: it serves files at ``/{owner}/{repo}/resolve/{revision}/{path}``
(optionally redirecting to a CDN path first, as the Hub does), honours ``Range``, answers 404 like the
Hub, and counts every body byte it sends. ``HF_ENDPOINT`` points at it; nothing leaves the machine.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFValueType
from support.helpers import LoopbackServer, shard_files
from support.hub_http import FOLDER, REPO, HubStandIn, handler_for

from gguf_mtp import BadGGUFError, HubError, compose
from gguf_mtp.check.inspect import inspect
from gguf_mtp.cli import main
from gguf_mtp.format.header import encode_kv, read_header
from gguf_mtp.hub.remote import FIRST_READ, HubFile
from gguf_mtp.testing.tiny_models import add_raw_kvs, write_draft, write_target


@pytest.fixture(scope="module")
def composite(nemotron_split: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    report = compose(nemotron_split, nemotron_draft0, tmp_path_factory.mktemp("composite"), progress=False)
    return report.output_paths[0]


@pytest.fixture(scope="module")
def published(server: HubStandIn, composite: Path) -> str:
    """The composite on the loopback Hub; returns the hf:// address of its first shard."""
    server.publish(shard_files(composite))
    return f"hf://{REPO}/{FOLDER}/{composite.name}"


def _comparable(summary_dict: dict) -> dict:
    """A summary without what differs between a local and a remote reading of the same files."""
    result = {k: v for k, v in summary_dict.items() if k not in ("source", "remote", "bytes_fetched", "http_requests")}
    result["files"] = [{k: v for k, v in f.items() if k != "name"} for f in result["files"]]
    return result


# ----------------------------------------------------------------------------------------------- tests


def test_remote_summary_equals_the_local_one(hub: HubStandIn, published: str, composite: Path) -> None:
    remote = inspect(published, tensors=True)
    assert remote.remote
    assert _comparable(remote.to_dict()) == _comparable(inspect(composite, tensors=True).to_dict())
    assert remote.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert [s.name for s in remote.shards] == [f"hf://{REPO}/{FOLDER}/{p.name}" for p in shard_files(composite)]


def test_remote_head_report_of_a_low_type_head_equals_the_local_one(
    hub: HubStandIn, nemotron_split: Path, tmp_path: Path
) -> None:
    draft = write_draft(tmp_path / "q2_k.gguf", quant="Q2_K", seed=62)
    model = compose(nemotron_split, draft, tmp_path / "low", progress=False).output_paths[0]
    hub.publish(shard_files(model), folder="low-type")
    remote = inspect(f"hf://{REPO}/low-type/{model.name}")
    local = inspect(model)
    assert remote.head is not None and remote.head.weak_types == ("Q2_K",)
    assert "--replace-head" in remote.head.suggestion
    assert local.head is not None and remote.head.to_dict() == local.head.to_dict()
    report = ("head: ", "  nextn_predict_layers = ", "  suggestion: ")
    assert [line for line in remote.describe() if line.startswith(report)] == [
        line for line in local.describe() if line.startswith(report)]


def test_only_header_bytes_are_transferred(hub: HubStandIn, published: str, composite: Path) -> None:
    summary = inspect(published)
    files = shard_files(composite)
    total_size = sum(p.stat().st_size for p in files)
    # every request asked for bytes that start inside the file's header, never in its data section
    data_offsets = {p.name: read_header(p).data_offset for p in files}
    for method, path, byte_range in hub.requests:
        assert method == "GET" and byte_range is not None
        start = int(re.match(r"bytes=(\d+)-", byte_range)[1])  # type: ignore[index]
        assert start < data_offsets[path.rsplit("/", 1)[1]]
    # bounded: one first read per file (the headers are a few KiB), far below the files' size
    assert len(hub.requests) == 3
    assert hub.total_sent <= 3 * FIRST_READ
    assert hub.total_sent < total_size / 20
    assert summary.bytes_fetched == hub.total_sent
    assert summary.http_requests == 3


def test_a_large_header_is_read_in_growing_ranges_and_no_further(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_target(tmp_path / "big", shards=2, name="Big-Vocab")
    tokens = [f"<token-{i:06d}-{'x' * 24}>" for i in range(12_000)]  # ~470 KiB of tokenizer, like a real shard 1
    add_raw_kvs(first, [encode_kv("tokenizer.ggml.tokens", GGUFValueType.ARRAY, tokens, GGUFValueType.STRING)])
    hub.publish(shard_files(first), folder="big")
    header = read_header(first)
    assert header.data_offset > 6 * FIRST_READ

    summary = inspect(f"hf://{REPO}/big/{first.name}")

    assert summary.tensor_count == sum(s.tensors for s in inspect(first).shards)
    assert summary.shards[0].header_bytes == header.data_offset
    first_file_requests = [r for r in hub.requests if r[1].endswith(first.name)]
    assert len(first_file_requests) > 2  # 64 KiB, then doubling
    assert header.data_offset <= hub.sent(first.name) <= 2 * header.data_offset


def test_header_bound_stops_reading(hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_target(tmp_path / "huge", name="huge-header")
    tokens = [f"token-{i:06d}" for i in range(20_000)]
    add_raw_kvs(first, [encode_kv("tokenizer.ggml.tokens", GGUFValueType.ARRAY, tokens, GGUFValueType.STRING)])
    hub.publish([first], folder="huge")
    monkeypatch.setattr("gguf_mtp.model.shard_scan.MAX_REMOTE_HEADER_BYTES", 200_000)

    with pytest.raises(BadGGUFError, match="header larger than the 200,000-byte limit"):
        inspect(f"hf://{REPO}/huge/{first.name}")
    assert hub.total_sent <= 200_000


def test_redirect_to_a_cdn_is_followed(hub: HubStandIn, published: str) -> None:
    hub.redirect = True
    assert inspect(published).mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert any(path.startswith("/cdn/") for _, path, _ in hub.requests)


def test_the_token_is_not_sent_to_another_host(
    hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_loopbacktesttoken")
    hub.redirect = True
    hub.redirect_base = hub.url.replace("127.0.0.1", "localhost")  # another origin, the same loopback server
    assert inspect(published).mtp_verdict == "MTP: yes (1 block, blk.3)"
    sent = [
        (path.startswith("/cdn/"), auth)
        for _, path, _, auth in ((r.method, r.path, r.byte_range, r.authorization) for r in hub.log)
    ]
    assert {auth for cdn, auth in sent if not cdn} == {"Bearer hf_loopbacktesttoken"}
    assert {auth for cdn, auth in sent if cdn} == {None}
    assert sum(cdn for cdn, _ in sent) == 3


def test_reads_go_through_huggingface_hubs_session(
    hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests (0.x), httpx (1.x) or httpx2 (2.x): the session huggingface_hub hands out is the one used,
    so what a user configured on it (headers, proxies, certificates) applies to header reads too."""
    import huggingface_hub

    if hasattr(huggingface_hub, "set_client_factory"):  # 1.x, 2.x: one shared httpx / httpx2 client
        from huggingface_hub.utils._http import default_client_factory as default

        configure, reset = huggingface_hub.set_client_factory, huggingface_hub.utils.close_session
    else:  # 0.x: a requests session per thread
        from huggingface_hub.utils._http import _default_backend_factory as default

        configure, reset = huggingface_hub.configure_http_backend, huggingface_hub.utils.reset_sessions

    def marked() -> Any:
        session = default()
        session.headers["X-Session-Marker"] = "configured-by-the-user"
        return session

    configure(marked)
    reset()
    try:
        summary = inspect(published)
    finally:
        configure(default)
        reset()
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert summary.bytes_fetched == hub.total_sent and summary.http_requests == 3
    assert [r.headers.get("x-session-marker") for r in hub.log] == ["configured-by-the-user"] * 3


def test_revision_selects_the_files(hub: HubStandIn, nemotron_split: Path) -> None:
    hub.publish(shard_files(nemotron_split), folder="rev", revision="v1.0")
    address = f"hf://{REPO}/rev/{nemotron_split.name}"
    assert inspect(f"{address}@v1.0").mtp_verdict == "MTP: no"
    assert inspect(f"hf://{REPO}@v1.0/rev/{nemotron_split.name}").tensor_count == 26
    with pytest.raises(HubError, match=r"no file rev/.* in tiny-org/Tiny-Nemotron-GGUF"):
        inspect(address)  # not on main
    assert all("/resolve/v1.0/" in path or "/resolve/main/" in path for _, path, _ in hub.requests)


def test_token_is_sent(hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_loopbacktesttoken")
    inspect(published)
    assert hub.authorization and all(a == "Bearer hf_loopbacktesttoken" for a in hub.authorization)


def test_missing_sibling_on_the_hub_is_reported(hub: HubStandIn, composite: Path) -> None:
    files = shard_files(composite)
    hub.publish([files[0], files[2]], folder="gap")
    summary = inspect(f"hf://{REPO}/gap/{files[2].name}")
    assert summary.problems[0] == f"shard 2 ({files[1].name}) is missing (3 files expected)"
    assert summary.shards[1].size is None


def test_missing_file_is_one_clear_error(hub: HubStandIn) -> None:
    with pytest.raises(HubError, match=r"no file nowhere/model\.gguf in tiny-org/Tiny-Nemotron-GGUF"):
        inspect(f"hf://{REPO}/nowhere/model.gguf")


def test_missing_repository_is_one_clear_error(hub: HubStandIn) -> None:
    with pytest.raises(HubError, match=r"repository tiny-org/no-such-repo not found"):
        inspect("hf://tiny-org/no-such-repo/model.gguf")


def test_offline_mode_is_one_clear_error_and_no_request(
    hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set"):
        inspect(published)
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE" in err
    assert hub.requests == []


def test_server_ignoring_ranges_is_read_no_further_than_needed(hub: HubStandIn, published: str) -> None:
    hub.ignore_range = True
    summary = inspect(published)
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert summary.bytes_fetched is not None and summary.bytes_fetched <= 3 * 2 * FIRST_READ
    assert summary.total_size > 10 * summary.bytes_fetched


def test_server_ignoring_ranges_cannot_serve_a_long_header(hub: HubStandIn, tmp_path: Path) -> None:
    first = write_target(tmp_path / "long", name="long-header")
    tokens = [f"token-{i:06d}" for i in range(20_000)]
    add_raw_kvs(first, [encode_kv("tokenizer.ggml.tokens", GGUFValueType.ARRAY, tokens, GGUFValueType.STRING)])
    hub.publish([first], folder="long")
    hub.ignore_range = True
    with pytest.raises(HubError, match="the server does not support HTTP range requests"):
        inspect(f"hf://{REPO}/long/{first.name}")


def test_cli_json_on_a_hub_file(hub: HubStandIn, published: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", published, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["remote"] is True
    assert report["mtp_verdict"] == "MTP: yes (1 block, blk.3)"
    assert report["bytes_fetched"] == hub.total_sent


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("hf://o/r/a.gguf", HubFile("o/r", "a.gguf")),
        ("hf://o/r/d/e/a-00001-of-00003.gguf@main", HubFile("o/r", "d/e/a-00001-of-00003.gguf", "main")),
        ("hf://o/r@v1/x/a.gguf", HubFile("o/r", "x/a.gguf", "v1")),
        ("hf://o/r/a.gguf@refs/pr/1", HubFile("o/r", "a.gguf", "refs/pr/1")),
        ("hf://datasets/o/r/x/a.gguf", HubFile("o/r", "x/a.gguf", None, "dataset")),
    ],
)
def test_hub_addresses_parse(address: str, expected: HubFile) -> None:
    assert HubFile.parse(address) == expected


@pytest.mark.parametrize("address", ["hf://o/r", "hf://o", "hf://o/r/", "hf:///r/a.gguf", "hf://o/r/a.gguf@"])
def test_incomplete_hub_addresses_are_refused(address: str) -> None:
    with pytest.raises(HubError, match="expected hf://OWNER/REPO/path/to/file.gguf"):
        HubFile.parse(address)


def test_hub_address_round_trips_and_finds_siblings() -> None:
    named = HubFile.parse("hf://o/r/q/m-00001-of-00003.gguf@v2")
    assert str(named) == "hf://o/r/q/m-00001-of-00003.gguf@v2"
    assert str(named.sibling("m-00002-of-00003.gguf")) == "hf://o/r/q/m-00002-of-00003.gguf@v2"


def test_verify_checks_a_hub_composite_from_its_headers(hub: HubStandIn, published: str) -> None:
    from gguf_mtp.check.verify import verify

    report = verify(published, progress=False)
    assert report.ok, report.describe()
    assert report.check("llama.cpp").status == "skip"
    assert "remote" in report.check("llama.cpp").detail
    assert hub.total_sent <= 3 * FIRST_READ


def test_verify_needs_local_files_to_compare_bytes(hub: HubStandIn, published: str, nemotron_split: Path) -> None:
    from gguf_mtp.check.verify import verify

    with pytest.raises(BadGGUFError, match="needs the composite on disk"):
        verify(published, target=nemotron_split, progress=False)


# ------------------------------------------------------------------------- hostile servers (issue 11 item 7)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["trickle", "trickle-headers"])
def test_a_trickling_server_ends_in_one_line_at_the_deadline(
    hub: HubStandIn, published: str, mode: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GGUF_MTP_HUB_REQUEST_TIMEOUT", "3")
    hub.misbehave = mode
    started = time.monotonic()
    assert main(["inspect", published]) == 2
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert 2.5 < elapsed < 8, elapsed  # the deadline, not a per-read timeout that a trickle never trips
    assert err.count("\n") == 1 and "no complete answer within 3 s (GGUF_MTP_HUB_REQUEST_TIMEOUT)" in err
    assert len(hub.requests) == 1  # a request past its deadline is not retried


def test_the_file_deadline_bounds_all_requests_for_one_file(
    hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GGUF_MTP_HUB_REQUEST_TIMEOUT", "60")
    monkeypatch.setenv("GGUF_MTP_HUB_FILE_TIMEOUT", "2")
    hub.misbehave = "trickle"
    started = time.monotonic()
    with pytest.raises(HubError, match=r"took longer than 2 s \(GGUF_MTP_HUB_FILE_TIMEOUT\)"):
        inspect(published)
    assert time.monotonic() - started < 6


@pytest.mark.parametrize("value", ["soon", "-1", "0", "inf", "nan"])
def test_a_bad_deadline_setting_is_one_line(
    hub: HubStandIn, published: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GGUF_MTP_HUB_REQUEST_TIMEOUT", value)
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"GGUF_MTP_HUB_REQUEST_TIMEOUT={value}: expected a number of seconds" in err


def test_a_redirect_loop_is_one_line(hub: HubStandIn, published: str, capsys: pytest.CaptureFixture[str]) -> None:
    hub.misbehave = "redirect-loop"
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too many redirects" in err and "Traceback" not in err


def test_a_body_mislabelled_as_gzip_is_one_line(
    hub: HubStandIn, published: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.misbehave = "fake-gzip"
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Content-Encoding: gzip" in err


@pytest.mark.slow
@pytest.mark.parametrize(("status", "line"), [(403, f"no access to {REPO} (403)"), (503, "503")])
def test_an_error_answer_is_not_read_beyond_a_small_cap(
    hub: HubStandIn, published: str, status: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """403: answered at once; 503: retried by huggingface_hub's back-off, which gives up on the third."""
    hub.misbehave = f"huge-{status}"
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err
    assert len(hub.requests) == (1 if status == 403 else 3)
    assert hub.total_sent < len(hub.requests) * 32 * 1024 * 1024  # what socket buffers held, not the GiB offered


# ------------------------------------------------------------------------- tokens, web URLs, paths


def test_a_non_ascii_token_is_one_line_and_nothing_is_sent(
    hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_t\u00f6ken")
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert (
        err == "gguf-mtp: error: HF_TOKEN contains non-ASCII characters; a Hugging Face token is ASCII "
        "(hf_...): set it again\n"
    )
    assert hub.requests == []


@pytest.mark.parametrize("kind", ["blob", "resolve"])
def test_a_hub_web_address_is_read_like_hf(hub: HubStandIn, published: str, composite: Path, kind: str) -> None:
    web = f"https://huggingface.co/{REPO}/{kind}/main/{FOLDER}/{composite.name}"
    summary = inspect(web)
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert summary.tensor_count == inspect(published).tensor_count
    assert HubFile.parse(f"https://huggingface.co/{REPO}/blob/refs%2Fpr%2F1/a.gguf?download=true") == HubFile(
        REPO, "a.gguf", "refs/pr/1"
    )
    assert HubFile.parse(f"{hub.url}/datasets/{REPO}/resolve/v1/x/a.gguf") == HubFile(REPO, "x/a.gguf", "v1", "dataset")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("https://example.com/x.gguf", "only files on the Hugging Face Hub can be read remotely"),
        (
            f"https://huggingface.co/{REPO}",
            "a Hub file's web address is https://huggingface.co/OWNER/REPO/blob/REV/PATH",
        ),
        (f"https://huggingface.co/{REPO}/tree/main/x.gguf", "a Hub file's web address is"),
    ],
)
def test_other_web_addresses_are_one_clear_line(address: str, message: str) -> None:
    with pytest.raises(HubError, match=re.escape(message)):
        HubFile.parse(address)


@pytest.mark.parametrize(
    "address",
    [
        f"hf://{REPO}/../../x.gguf",
        f"hf://{REPO}/a/../../../etc/x.gguf",
        f"hf://{REPO}//abs.gguf",
        f"hf://{REPO}/./x.gguf",
        f"https://huggingface.co/{REPO}/resolve/main/%2E%2E/x.gguf",
    ],
)
def test_paths_that_leave_the_repository_are_refused_before_any_request(hub: HubStandIn, address: str) -> None:
    with pytest.raises(HubError, match="it must stay inside the repository"):
        inspect(address)
    assert hub.requests == []


@pytest.mark.parametrize(
    "address", ["hf://o\n/r/a.gguf", "hf://o/r\n/a.gguf", "hf://o/r--x/a.gguf", "hf://o/.r/a.gguf"]
)
def test_malformed_repo_ids_in_addresses_are_refused(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HubError, match=r"is not a Hub repo id \(OWNER/NAME\)"):
        HubFile.parse(address)
    assert main(["inspect", address]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a Hub repo id (OWNER/NAME)" in err  # the newline is shown as \x0a


# ------------------------------------------------------------------------- an authenticating proxy (issue 24 item 2)

PROXY_USER, PROXY_PASSWORD = "proxy-user", "s3cret:pass"
PROXIED_HOST = "hub.gguf-mtp-proxy.test"  # RFC 6761: never resolves, so only the proxy can reach it
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class AuthProxy:
    """A forward HTTP proxy on loopback that demands Basic credentials (407 without them) and sends every
    request, whatever host it names, to the Hub stand-in."""

    upstream: str  # host:port of the stand-in
    url: str = ""
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (absolute URL asked for, Proxy-Authorization)

    @property
    def credentials(self) -> str:
        import base64

        return "Basic " + base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()


def _proxy_handler(proxy: AuthProxy) -> type[BaseHTTPRequestHandler]:
    import http.client
    from urllib.parse import urlsplit

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            offered = self.headers.get("Proxy-Authorization")
            proxy.seen.append((self.path, offered))
            if offered != proxy.credentials:
                self.send_response(407)
                self.send_header("Proxy-Authenticate", 'Basic realm="gguf-mtp test proxy"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            target = urlsplit(self.path)
            upstream = http.client.HTTPConnection(proxy.upstream, timeout=30)
            try:
                forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream.request("GET", target.path + (f"?{target.query}" if target.query else ""), headers=forwarded)
                answer = upstream.getresponse()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.end_headers()
                while chunk := answer.read(64 * 1024):
                    self.wfile.write(chunk)
            finally:
                upstream.close()

    return Handler


def _fresh_sessions() -> None:
    """Drop huggingface_hub's cached HTTP session(s): the next request makes one from the environment."""
    import huggingface_hub.utils

    (getattr(huggingface_hub.utils, "close_session", None) or huggingface_hub.utils.reset_sessions)()


@pytest.fixture
def proxy(hub: HubStandIn, monkeypatch: pytest.MonkeyPatch) -> Iterator[AuthProxy]:
    """The proxy, named with its credentials in HTTP_PROXY / HTTPS_PROXY; HF_ENDPOINT is a host only it reaches.

    huggingface_hub's httpx clients read the proxy settings when they are made: fresh ones before and after.
    """
    found = AuthProxy(hub.url.split("//", 1)[1])
    httpd = LoopbackServer(("127.0.0.1", 0), _proxy_handler(found))
    found.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    address = found.url.replace("//", f"//{PROXY_USER}:{PROXY_PASSWORD.replace(':', '%3A')}@")
    monkeypatch.setenv("HTTP_PROXY", address)
    monkeypatch.setenv("HTTPS_PROXY", address)
    monkeypatch.setenv("HF_ENDPOINT", f"http://{PROXIED_HOST}")
    _fresh_sessions()
    yield found
    monkeypatch.undo()  # the proxy settings go before the next client is made
    _fresh_sessions()
    httpd.shutdown()
    httpd.server_close()


def test_inspect_through_an_authenticating_proxy(
    hub: HubStandIn, proxy: AuthProxy, published: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_loopbacktesttoken")
    summary = inspect(published)
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert summary.http_requests == 3 and summary.bytes_fetched == hub.total_sent
    assert len(proxy.seen) == 3
    assert all(url.startswith(f"http://{PROXIED_HOST}/{REPO}/resolve/main/") for url, _ in proxy.seen)
    assert {auth for _, auth in proxy.seen} == {proxy.credentials}  # every request carried the credentials
    assert hub.authorization == ["Bearer hf_loopbacktesttoken"] * 3  # the Hub's token passed through
    assert all("proxy-authorization" not in r.headers for r in hub.log)


def test_a_proxy_refusing_its_credentials_is_one_line(
    proxy: AuthProxy,
    hub: HubStandIn,
    published: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)  # no credentials
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    _fresh_sessions()
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the proxy asks for credentials (407)" in err, err
    assert proxy.seen and all(auth is None for _, auth in proxy.seen)
    assert hub.requests == []


# ------------------------------------------------------------------------- a private CA (issue 24 item 2)


@pytest.fixture(scope="module")
def tls_hub(server: HubStandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The stand-in's files over HTTPS on ``localhost``, with a certificate of its own: (endpoint, CA file)."""
    import ssl
    import subprocess

    from support.session import IN_CI

    openssl = shutil.which("openssl")
    if openssl is None:
        if IN_CI:
            pytest.fail("CI=true: the private-CA test needs the openssl command to make its certificate")
        pytest.skip("the openssl command is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "hub.pem", folder / "hub.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd = LoopbackServer(("127.0.0.1", 0), handler_for(server))
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://localhost:{httpd.server_address[1]}", cert
    httpd.shutdown()
    httpd.server_close()


_CA_SETTINGS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@pytest.fixture
def over_tls(hub: HubStandIn, tls_hub: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HF_ENDPOINT on the HTTPS stand-in, no proxy and no CA setting yet; yields the CA file to trust."""
    endpoint, cert = tls_hub
    for name in (*_CA_SETTINGS, "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    _fresh_sessions()
    yield cert
    monkeypatch.undo()  # the CA settings go before the next client is made
    _fresh_sessions()


def test_a_ca_bundle_from_the_environment_is_trusted(
    over_tls: Path, hub: HubStandIn, published: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSL_CERT_FILE (httpx, httpx2) or REQUESTS_CA_BUNDLE (requests): whichever the release line reads."""
    monkeypatch.setenv("SSL_CERT_FILE", str(over_tls))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(over_tls))
    _fresh_sessions()
    summary = inspect(published)
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert summary.bytes_fetched == hub.total_sent and len(hub.requests) == 3


def test_an_untrusted_certificate_is_one_line(
    over_tls: Path, hub: HubStandIn, published: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", published]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TLS with localhost:" in err and "certificate verify failed" in err, err
    assert hub.requests == []


# ------------------------------------------------ one version per file (issue 29 item 4)


def _long_header(folder: Path, tokens: int) -> Path:
    """A one-file model named ``Pushed.gguf`` whose header needs several range requests (``tokens`` sets its
    size, so two versions differ in their header's length and bytes)."""
    model = write_target(folder, name="Pushed")
    names = [f"<tok-{i:06d}-{'y' * 20}>" for i in range(tokens)]
    add_raw_kvs(model, [encode_kv("tokenizer.ggml.tokens", GGUFValueType.ARRAY, names, GGUFValueType.STRING)])
    assert read_header(model).data_offset > 4 * FIRST_READ
    return model


@pytest.fixture
def two_versions(tmp_path: Path) -> tuple[Path, Path]:
    return _long_header(tmp_path / "v1", 9_000), _long_header(tmp_path / "v2", 11_000)


def _push_after_first_answer(hub: HubStandIn, new: Path, folder: str) -> None:
    """A push of ``new`` lands between the first and the second range request."""

    def push(gets_before: int) -> None:
        if gets_before == 1:
            hub.publish([new], folder=folder)

    hub.before_get = push


@pytest.mark.parametrize("send_commit", [True, False], ids=["mirror-with-commit", "no-commit-header"])
def test_a_file_changed_between_range_reads_is_one_line_and_nothing_is_reported(
    hub: HubStandIn, two_versions: tuple[Path, Path], send_commit: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that serves the newest bytes whatever commit is asked for (or names no commit): the change is
    seen in the ETag / size of the next answer, and the read stops; no header stitched from two versions."""
    old, new = two_versions
    hub.publish([old], folder="push")
    hub.serve_newest, hub.send_commit = True, send_commit
    _push_after_first_answer(hub, new, "push")
    address = f"hf://{REPO}/push/{old.name}"
    assert main(["inspect", address]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"gguf-mtp: error: {address}: the file changed on the Hub while it was read (")
    assert len(hub.requests) == 2  # the second answer is refused; nothing more is asked for
    hub.publish([old], folder="push")
    hub.reset()
    _push_after_first_answer(hub, new, "push")
    assert main(["verify", address]) != 0
    out, err = capsys.readouterr()
    assert "PASS" not in out and "changed on the Hub while it was read" in err, out + err


def test_later_ranges_are_pinned_to_the_first_answers_commit(
    hub: HubStandIn, two_versions: tuple[Path, Path]
) -> None:
    """The Hub keeps every commit: the reads after the first ask for the first answer's commit, so a push
    between them changes nothing that is read."""
    old, new = two_versions
    commit = hub.publish([old], folder="pin")
    _push_after_first_answer(hub, new, "pin")
    summary = inspect(f"hf://{REPO}/pin/{old.name}")
    assert _comparable(summary.to_dict()) == _comparable(inspect(old).to_dict())
    paths = [path for _, path, _ in hub.requests]
    assert len(paths) > 2 and paths[0].startswith(f"/{REPO}/resolve/main/pin/")
    assert all(path.startswith(f"/{REPO}/resolve/{commit}/pin/") for path in paths[1:]), paths
    assert hub.commits[(REPO, "main")] != commit  # the push did land in between
    assert inspect(f"hf://{REPO}/pin/{old.name}").shards[0].header_bytes == read_header(new).data_offset


# ------------------------------------------------ bounded shard walks (issue 29 item 8)


def _renamed(files: list[Path], folder: Path, count: int) -> list[Path]:
    """``files`` (a set's shards, in order) under names that promise ``count`` shards."""
    folder.mkdir()
    out = []
    for number, f in enumerate(files, start=1):
        out.append(folder / f"Many-{number:05d}-of-{count:05d}.gguf")
        shutil.copy(f, out[-1])
    return out


def test_a_name_promising_5000_shards_asks_only_for_those_the_set_declares(
    hub: HubStandIn, composite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _renamed(shard_files(composite), tmp_path / "many", 5000)  # shard 1 says split.count = 3
    hub.publish(files, folder="many")
    address = f"hf://{REPO}/many/{files[0].name}"
    summary = inspect(address)
    assert [path.rsplit("/", 1)[1] for _, path, _ in hub.requests] == [f.name for f in files]  # 3, not 5,000
    assert summary.http_requests == 3
    assert summary.problems[0] == (
        f"the file names promise 5,000 shards, but shard 1 ({files[0].name}) says split.count = 3: "
        "4,997 of them were not asked for"
    )
    assert main(["inspect", address]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "inconsistent: the file names promise 5,000 shards" in err, err
    assert "consistency: ok" not in out and "promise 5,000 shards" in out, out


def test_missing_shards_in_a_row_end_the_walk(hub: HubStandIn, composite: Path, tmp_path: Path) -> None:
    """No readable shard to go by: three missing shards in a row end the walk (the named one is still read)."""
    files = _renamed(shard_files(composite) * 2, tmp_path / "gaps", 99_999)
    hub.publish([files[4]], folder="gaps")  # shards 1-4 absent: only the named shard 5 is there
    summary = inspect(f"hf://{REPO}/gaps/{files[4].name}")
    assert [path.rsplit("/", 1)[1] for _, path, _ in hub.requests] == [f.name for f in files[:3]] + [files[4].name]
    assert summary.problems[0] == (
        "the file names promise 99,999 shards, but 3 shards in a row are missing: 99,995 of them were not asked for"
    )


class _UnreadAnswer:
    """A range answer whose body must not be read: only its status and headers are there."""

    def __init__(self, status: int, **headers: str) -> None:
        self.status_code = status
        self.headers = {k.replace("_", "-"): v for k, v in headers.items()}

    def iter_raw(self, size: int) -> Iterator[bytes]:
        raise AssertionError("the body was read before the answer's size was checked")


_STATED = [
    (_UnreadAnswer(206, Content_Range="bytes 100-199/5000"), 100, 5000),
    (_UnreadAnswer(200, Content_Length="5000"), 0, 5000),
    (_UnreadAnswer(416, Content_Range="bytes */0"), 0, 0),
]
_REFUSED = [
    (_UnreadAnswer(206, Content_Range="bytes 0-99/5000"), 100, "unexpected Content-Range"),
    (_UnreadAnswer(206, Content_Range="bytes 100-199/*"), 100, "unexpected Content-Range"),
    (_UnreadAnswer(200, Content_Length="5000"), 100, "does not support HTTP range requests"),
    (_UnreadAnswer(200), 0, "sends no Content-Length"),
    (_UnreadAnswer(416), 0, r"refused the byte range request \(HTTP 416\)"),
    (_UnreadAnswer(206, Content_Range="bytes 0-9/10", Content_Encoding="gzip"), 0, "compressed the body"),
    (_UnreadAnswer(302), 0, "unexpected HTTP status 302"),
]


@pytest.mark.parametrize(("answer", "start", "size"), _STATED)
def test_the_size_a_range_answer_states_is_read_from_its_headers_alone(answer: Any, start: int, size: int) -> None:
    from gguf_mtp.hub.remote import _stated_size

    assert _stated_size(answer, start, "hf://o/r/x.gguf") == size


@pytest.mark.parametrize(("answer", "start", "error"), _REFUSED)
def test_a_range_answer_that_states_no_usable_size_is_refused_unread(answer: Any, start: int, error: str) -> None:
    from gguf_mtp.hub.remote import _stated_size

    with pytest.raises(HubError, match=error):
        _stated_size(answer, start, "hf://o/r/x.gguf")
