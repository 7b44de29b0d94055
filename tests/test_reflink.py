"""On a real reflink filesystem (a small XFS image, loop-mounted), compose, strip and graft share the
input's extents: FIEMAP shows the same physical blocks, the filesystem's used blocks barely grow, and the
bytes are those written on any other filesystem.

Needs root, ``mkfs.xfs`` (Debian's ``xfsprogs``, which ``.ci/run`` installs) and loop devices. Without
them the tests are skipped with the reason; under ``CI=true`` they fail instead, with the same reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import file_hashes
from support.session import IN_CI

from gguf_mtp import compose, open_model
from gguf_mtp.check.verify import verify
from gguf_mtp.files.extents import ExtentProver, file_extents
from gguf_mtp.files.kernel_copy import SHARE_BLOCK, can_share
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.graft import graft
from gguf_mtp.jobs.strip import strip
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

IMAGE_BYTES = 512 * 1024 * 1024  # mkfs.xfs wants 300 MiB at least; the image file is sparse
_SHARED_FLAG = 0x2000


def _unavailable(reason: str) -> None:
    message = f"no XFS reflink filesystem to test on: {reason}"
    if IN_CI:
        pytest.fail(message + " (CI=true: these tests must run; run as root with xfsprogs and loop devices)")
    pytest.skip(message)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def xfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A freshly made XFS filesystem with reflink, mounted; unmounted afterwards."""
    if os.geteuid() != 0:
        _unavailable("loop mounts need root")
    mkfs = shutil.which("mkfs.xfs")
    if mkfs is None:
        _unavailable("mkfs.xfs not found (apt-get install xfsprogs)")
    base = tmp_path_factory.mktemp("xfs")
    image, mount_point = base / "xfs.img", base / "mnt"
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    made = _run(mkfs, "-q", "-m", "reflink=1", str(image))
    if made.returncode:
        _unavailable(f"mkfs.xfs -m reflink=1 failed: {made.stderr.strip()}")
    mount_point.mkdir()
    mounted = _run("mount", "-o", "loop", str(image), str(mount_point))
    if mounted.returncode:
        _unavailable(f"mount -o loop failed: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if _run("umount", str(mount_point)).returncode:
            _run("umount", "-l", str(mount_point))
        image.unlink(missing_ok=True)


def _used(mount: Path) -> int:
    """Bytes the filesystem has in use, after everything reached the disk."""
    os.sync()
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _copy_model(first: Path, dest: Path) -> Path:
    """A plain (unshared) copy of a model's files in ``dest``; path of its first file."""
    dest.mkdir(parents=True)
    for path in open_model(first).paths:
        with open(path, "rb") as src, open(dest / path.name, "wb") as dst:
            shutil.copyfileobj(src, dst)  # bytes, never a clone: the inputs must own their blocks
    return dest / Path(first).name


def _shared_bytes(a: Path, b: Path) -> int:
    """Bytes of ``b``'s tensor data proven (FIEMAP) to sit on ``a``'s physical blocks, tensor by tensor."""
    prover = ExtentProver()
    ha, hb = read_header(a), read_header(b)
    located = {t.name: t for t in ha.tensors}
    shared = 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for tensor in hb.tensors:
            if tensor.name in located:
                lo, hi = prover.shared_span(
                    fa.fileno(), ha.data_offset + located[tensor.name].offset,
                    fb.fileno(), hb.data_offset + tensor.offset, tensor.nbytes,
                )
                shared += hi - lo
    return shared


@pytest.fixture(scope="module")
def inputs(xfs: Path, nemotron_split: Path, nemotron_draft0: Path) -> tuple[Path, Path]:
    """The 3-shard target and the draft, as plain files on the XFS image."""
    target = _copy_model(nemotron_split, xfs / "in" / "target")
    draft = xfs / "in" / "draft" / "mtp.gguf"
    draft.parent.mkdir(parents=True)
    shutil.copyfile(nemotron_draft0, draft)
    return target, draft


def _whole_blocks(path: Path) -> int:
    """Bytes of ``path``'s tensors in whole SHARE_BLOCK blocks: what a per-tensor extent proof can cover."""
    header = read_header(path)
    total = 0
    for tensor in header.tensors:
        start = header.data_offset + tensor.offset
        lo, hi = -(-start // SHARE_BLOCK) * SHARE_BLOCK, (start + tensor.nbytes) // SHARE_BLOCK * SHARE_BLOCK
        total += max(0, hi - lo)
    return total


def _target_data(target: Path) -> int:
    return sum(h.data_size for h in open_model(target).headers)


def test_compose_on_xfs_shares_the_target_extents_and_costs_only_the_draft(
    xfs: Path, inputs: tuple[Path, Path], nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    target, draft = inputs
    assert can_share(target, xfs)
    before = _used(xfs)
    report = compose(target, draft, xfs / "composite", progress=False)
    grown = _used(xfs) - before
    # The same bytes as on ext4 (tmp_path): the filesystem changes how, never what.
    elsewhere = compose(nemotron_split, nemotron_draft0, tmp_path / "composite", progress=False)
    assert file_hashes(xfs / "composite") == file_hashes(elsewhere.output_paths[0].parent)

    data = _target_data(target)
    # Every shard's target data is shared but for the partial blocks at its two ends.
    assert data - 2 * SHARE_BLOCK * len(report.output_paths) <= report.bytes_shared <= data
    assert "reflink" in report.copy_methods and "shared with the inputs" in "\n".join(report.describe())
    assert report.write_fields()["bytes_copied"] == report.bytes_written - report.bytes_shared
    # The disk pays for the draft, the headers and the partial blocks: not for the target's data again.
    draft_bytes = read_header(draft).data_size
    assert grown <= draft_bytes + 64 * 1024 * len(report.output_paths), (grown, draft_bytes)
    for source, output in zip(open_model(target).paths, report.output_paths):
        assert _shared_bytes(source, output) == _whole_blocks(source) > 0
        with open(output, "rb") as f:
            extents = file_extents(f.fileno())
        assert extents and any(e.flags & _SHARED_FLAG for e in extents)


def test_verify_on_xfs_proves_the_shared_ranges_by_their_extents(xfs: Path, inputs: tuple[Path, Path]) -> None:
    target, draft = inputs
    composite = compose(target, draft, xfs / "verified", progress=False).output_paths[0]
    report = verify(composite, target=target, draft=draft, llama=False, progress=False)
    assert report.ok, report.describe()
    # Tensor by tensor, every whole block of the target's tensors is proven; only partial blocks are read.
    assert report.bytes_shared == sum(_whole_blocks(p) for p in open_model(target).paths) > 0
    assert "shared with the target:" in report.check("target tensors").detail
    assert report.to_dict()["bytes_shared"] == report.bytes_shared


def test_verify_on_xfs_still_finds_a_changed_byte_in_a_shared_file(xfs: Path, inputs: tuple[Path, Path]) -> None:
    target, draft = inputs
    composite = compose(target, draft, xfs / "changed", progress=False).output_paths
    last = composite[-1]
    header = read_header(last)
    tensor = header.tensors[0]
    with open(last, "r+b") as f:  # a write into a shared block gets its own block (copy on write)
        f.seek(header.data_offset + tensor.offset + SHARE_BLOCK + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify(composite[0], target=target, draft=draft, llama=False, progress=False)
    assert not report.check("target tensors").ok
    assert repr(tensor.name) in report.check("target tensors").detail


def test_strip_on_xfs_gives_back_the_target_sharing_its_blocks(xfs: Path, inputs: tuple[Path, Path]) -> None:
    target, draft = inputs
    composite = compose(target, draft, xfs / "to-strip", progress=False).output_paths[0]
    before = _used(xfs)
    report = strip(composite, xfs / "stripped", progress=False)
    grown = _used(xfs) - before
    assert file_hashes(xfs / "stripped") == file_hashes(target.parent)
    assert report.bytes_shared >= _target_data(target) - 2 * SHARE_BLOCK * 3
    assert grown <= 64 * 1024 * len(report.output_paths), grown
    for source, output in zip(open_model(composite).paths, report.output_paths):
        assert _shared_bytes(source, output) > 0


def test_graft_on_xfs_shares_the_target_extents(xfs: Path, inputs: tuple[Path, Path]) -> None:
    target, draft = inputs
    donor = compose(target, draft, xfs / "donor", progress=False).output_paths[0]
    report = graft(donor, target, xfs / "grafted", verify=True, llama=False, progress=False)
    assert report.ok
    assert file_hashes(xfs / "grafted") == file_hashes(donor.parent)
    assert report.bytes_shared >= _target_data(target) - 2 * SHARE_BLOCK * 3
    for source, output in zip(open_model(target).paths, report.output_paths):
        assert _shared_bytes(source, output) == _whole_blocks(source) > 0


def test_preflight_counts_shared_bytes_as_free(xfs: Path, inputs: tuple[Path, Path]) -> None:
    target, draft = inputs
    planned = compose(target, draft, xfs / "dry", dry_run=True, progress=False).plan.bytes_to_write
    shareable = _target_data(target)
    filler = xfs / "filler"
    # Leave room for the composite less its shareable data (plus slack for metadata), but not for all of it.
    free = os.statvfs(xfs).f_bavail * os.statvfs(xfs).f_frsize
    room = planned - shareable // 2
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, free - room)
    try:
        assert os.statvfs(xfs).f_bavail * os.statvfs(xfs).f_frsize < planned
        report = compose(target, draft, xfs / "tight", progress=False)
        assert report.bytes_shared > 0
    finally:
        filler.unlink()


def test_compose_of_a_draft_converted_for_the_target_shares_the_draft_too(xfs: Path, inputs: tuple[Path, Path]) -> None:
    # convert --target puts the draft's data where compose appends it (mod 4 KiB): on XFS the composite then
    # shares the draft's extents as well as the target's, and costs the disk only headers and partial blocks.
    target, _ = inputs
    head = write_mtpv2_checkpoint(xfs / "in" / "head", files=2)
    draft = convert(head, xfs / "in" / "converted.gguf", target=target, progress=False).output
    before = _used(xfs)
    report = compose(target, draft, xfs / "composite-converted", progress=False)
    grown = _used(xfs) - before
    copied = report.bytes_written - report.bytes_shared
    assert copied <= 2 * SHARE_BLOCK * (len(report.output_paths) + len(read_header(draft).tensors)) + 64 * 1024
    assert grown <= 64 * 1024 * (len(report.output_paths) + 1), grown
    assert _shared_bytes(draft, report.output_paths[-1]) == _whole_blocks(draft) > 0
