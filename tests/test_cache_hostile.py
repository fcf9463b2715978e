"""The persistent cache against hostile, corrupt and odd files: FIFOs, symlinks, other owners,
world-writable directories, forged inner headers, a corrupt payload, garbage in `inspect`, and
writes into mapped tensors. Every probe that could hang or crash runs in a child with a timeout."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from torch_ktmoe import cache
from tests.helpers import random_experts
from tests.helpers import root_only
from tests.helpers.cache_layer import E, FILE, H, I, loaded, make, reason, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
W13_OFFSET = 2 * MiB  # the first slice of a cache file: w13, expert 0 first


def child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs code in a new interpreter (repository on sys.path); a hang is a test failure."""
    script = f"import sys; sys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(code)
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung (the cache blocked on a file)")


def w13_row_bytes(directory) -> int:
    (row,) = [r for r in cache.inspect_dir(directory) if r["name"] == FILE]
    return row["w13_shape"][1]


def patch_file(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ---------------------------------------------------------------- non-regular files
@pytest.mark.parametrize("where", [FILE, FILE + ".lock"])
def test_fifo_does_not_hang_load_or_inspect(tmp_path, where):
    os.mkfifo(tmp_path / where)
    r = child(f"""
        from tests.helpers.cache_layer import loaded, run
        from torch_ktmoe import cache
        m = loaded({str(tmp_path)!r})
        print("REASON", m.cache_events[0]["reason"])
        run(m)
        print("ROWS", [(x["name"], x["valid"], x["reason"]) for x in cache.inspect_dir({str(tmp_path)!r})])
    """)
    assert r.returncode == 0, r.stderr
    if where == FILE:
        assert "not a regular file" in r.stdout, r.stdout
    assert "ROWS" in r.stdout


def test_fifo_in_inspect_cli(tmp_path):
    os.mkfifo(tmp_path / "x.ktmoe")
    r = child(f"""
        from torch_ktmoe.__main__ import main
        sys.exit(main(["inspect", {str(tmp_path)!r}]))
    """)
    assert r.returncode == 0, r.stderr
    assert "not a regular file" in r.stdout


# ---------------------------------------------------------------- symlinks
def test_symlinked_lock_creates_nothing_elsewhere(tmp_path):
    d, victim = tmp_path / "cache", tmp_path / "elsewhere" / "victim"
    d.mkdir()
    victim.parent.mkdir()
    os.symlink(victim, d / (FILE + ".lock"))
    ref = run(loaded(None))
    m = loaded(d)
    assert not victim.exists(), "the lock followed a planted symlink"
    assert not m.cache_hit and "symlink" in reason(m), reason(m)
    assert torch.equal(run(m), ref)
    assert m.file_backed_bytes > 0  # still file-backed: an unnamed file, nothing kept under a planted name


def test_symlinked_final_path_is_not_followed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    ref = run(loaded(a))
    before = (a / FILE).read_bytes()
    os.symlink(a / FILE, b / FILE)
    m = loaded(b)
    assert not m.cache_hit and "not a regular file" in reason(m), reason(m)
    assert torch.equal(run(m), ref)
    assert not os.path.islink(b / FILE) and (a / FILE).read_bytes() == before
    assert loaded(b).cache_hit


# ---------------------------------------------------------------- owners and permissions
@root_only
def test_file_of_another_user_is_not_trusted(tmp_path):
    ref = run(loaded(tmp_path))
    os.chown(tmp_path / FILE, 65534, 65534)
    m = loaded(tmp_path)
    assert not m.cache_hit and reason(m).startswith("untrusted:") and "65534" in reason(m), reason(m)
    assert torch.equal(run(m), ref)
    assert os.stat(tmp_path / FILE).st_uid == os.geteuid()  # rebuilt as ours
    os.chown(tmp_path / FILE, 65534, 65534)
    assert loaded(tmp_path, cache_trust_others=True).cache_hit  # the caller opted in


def test_world_writable_file_is_not_trusted(tmp_path):
    loaded(tmp_path)
    os.chmod(tmp_path / FILE, 0o666)
    m = loaded(tmp_path)
    assert not m.cache_hit and reason(m).startswith("untrusted:") and "writable" in reason(m), reason(m)
    assert loaded(tmp_path).cache_hit


def test_world_writable_directory_keeps_nothing(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    ref = run(loaded(None))
    m = loaded(d)
    assert not m.cache_hit and reason(m).startswith("untrusted:") and "writable by others" in reason(m)
    assert m.file_backed_bytes > 0 and torch.equal(run(m), ref)
    assert os.listdir(d) == []  # no lock, no cache file under a name others can plant
    trusting = loaded(d, cache_trust_others=True)
    assert not trusting.cache_hit and (d / FILE).exists()


# ---------------------------------------------------------------- forged headers and payload
# (offset in the 64-byte PackedMatrixHeader, value bytes, field the error names)
FORGERIES = [
    (20, (1 << 24).to_bytes(4, "little"), "kp"),
    (8, (1 << 30).to_bytes(4, "little"), "n"),
    (16, (4096).to_bytes(4, "little"), "np"),
    (24, (7).to_bytes(4, "little"), "group"),
    (32, (-64).to_bytes(8, "little", signed=True), "data_offset"),
    (40, (1 << 40).to_bytes(8, "little"), "scale_offset"),
    (6, bytes([9]), "format"),
    (6, bytes([0]), "format"),  # claims bf16 over int8 bytes
    (28, (1).to_bytes(4, "little"), "reserved"),
]


@pytest.mark.parametrize("offset, value, field", FORGERIES, ids=[f"{f[2]}-{i}" for i, f in enumerate(FORGERIES)])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_forged_inner_header_is_an_error_in_the_op(fmt, offset, value, field):
    from torch_ktmoe import ops

    gate_up, down = random_experts(E, H, I)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    for e in range(E):  # every expert alike, so only the field check can catch it
        w13[e, offset:offset + len(value)] = torch.tensor(list(value), dtype=torch.uint8)
    x = torch.randn(3, H)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0]])
    with pytest.raises(RuntimeError, match=rf"w13 .*\b{field}\b"):
        ops.moe_forward(x, ids, torch.full((3, 2), 0.5), w13, w2)


@pytest.mark.parametrize("offset, value, field", FORGERIES[:6], ids=[f[2] for f in FORGERIES[:6]])
def test_forged_inner_header_in_cache_file_is_rebuilt(tmp_path, offset, value, field):
    ref = run(loaded(tmp_path))
    row = w13_row_bytes(tmp_path)
    for e in range(E):
        patch_file(tmp_path / FILE, W13_OFFSET + e * row + offset, value)
    m = loaded(tmp_path)
    assert not m.cache_hit and reason(m).startswith("corrupt:") and field in reason(m), reason(m)
    assert torch.equal(run(m), ref)
    assert loaded(tmp_path).cache_hit


def test_random_payload_caught_by_full_verify(tmp_path):
    ref = run(loaded(tmp_path))
    row = w13_row_bytes(tmp_path)
    patch_file(tmp_path / FILE, W13_OFFSET + row + 256, os.urandom(512))  # expert 1's data, not its header
    assert loaded(tmp_path).cache_hit  # header verification is instant: it cannot see the payload
    rows = {r["name"]: r for r in cache.inspect_dir(tmp_path, verify=True)}
    assert not rows[FILE]["valid"] and "checksum" in rows[FILE]["reason"]
    m = loaded(tmp_path, verify="full")
    assert not m.cache_hit and reason(m).startswith("corrupt: data checksum"), reason(m)
    assert torch.equal(run(m), ref)
    assert loaded(tmp_path, verify="full").cache_hit


def test_whole_payload_overwritten_is_rebuilt_by_header_verify(tmp_path):
    ref = run(loaded(tmp_path))
    size = os.path.getsize(tmp_path / FILE)
    patch_file(tmp_path / FILE, W13_OFFSET, os.urandom(size - W13_OFFSET))
    m = loaded(tmp_path)
    assert not m.cache_hit and reason(m).startswith("corrupt:"), reason(m)
    assert torch.equal(run(m), ref)


def test_verify_policy_is_checked():
    with pytest.raises(ValueError, match="verify"):
        make(None, verify="sometimes")


# ---------------------------------------------------------------- inspect
def test_inspect_reports_each_bad_file_on_its_own(tmp_path):
    loaded(tmp_path)
    (tmp_path / "garbage.ktmoe").write_bytes(b"KTMOECA1" + os.urandom(8192))
    (tmp_path / "short.ktmoe").write_bytes(b"KTMOECA1" + b"\xff" * 10)
    os.mkdir(tmp_path / "dir.ktmoe")
    rows = {r["name"]: r for r in cache.inspect_dir(tmp_path)}
    assert rows[FILE]["valid"]
    for bad in ("garbage.ktmoe", "short.ktmoe", "dir.ktmoe"):
        assert not rows[bad]["valid"] and rows[bad]["reason"], rows[bad]
    r = child(f"""
        from torch_ktmoe.__main__ import main
        sys.exit(main(["inspect", {str(tmp_path)!r}, "--verify"]))
    """)
    assert r.returncode == 0, r.stderr
    assert "garbage.ktmoe" in r.stdout and f"{FILE}" in r.stdout and "1 valid" in r.stdout, r.stdout


# ---------------------------------------------------------------- writes into mapped tensors
@pytest.mark.parametrize("load", ["built", "mapped"])
def test_write_into_cache_tensor_is_private_not_a_segfault(tmp_path, load):
    ref = run(loaded(tmp_path)) if load == "mapped" else None
    r = child(f"""
        from tests.helpers.cache_layer import loaded
        m = loaded({str(tmp_path)!r})
        print("HIT", m.cache_hit)
        m.w13_0.zero_()
        assert int(m.w13_0.sum()) == 0
    """)
    assert r.returncode == 0, f"rc={r.returncode}: {r.stderr[-2000:]}"
    assert ("HIT True" in r.stdout) == (load == "mapped")
    m = loaded(tmp_path)
    assert m.cache_hit  # the file never saw the write
    if ref is not None:
        assert torch.equal(run(m), ref)


# ---------------------------------------------------------------- forged sizes
def _fnv1a64(data: bytes) -> int:
    x = 1469598103934665603
    for b in data:
        x = ((x ^ b) * 1099511628211) & (2**64 - 1)
    return x


def forge_expert_count(path, experts: int) -> None:
    """Rewrites a cache file's header to claim `experts` experts (a valid checksum; the file grown sparse to fit)."""
    import struct

    with open(path, "r+b") as f:
        h = bytearray(f.read(4096))
        offsets, cols = [], []
        for t in range(2):  # tensor entries at 40: offset, rows, cols (int64 each), data checksum, reserved
            off, _, col = struct.unpack_from("<qqq", h, 40 + 32 * t)
            struct.pack_into("<q", h, 40 + 32 * t + 8, experts)
            offsets.append(off)
            cols.append(col)
        struct.pack_into("<q", h, 296 + 40, experts)  # the key record at 296: tag, format[16], version, part, group, E
        size = max(o + experts * c for o, c in zip(offsets, cols))
        size = -(-size // (2 * MiB)) * (2 * MiB)
        struct.pack_into("<q", h, 24, size)  # file_bytes
        struct.pack_into("<Q", h, 16, 0)
        struct.pack_into("<Q", h, 16, _fnv1a64(bytes(h)))
        f.seek(0)
        f.write(h)
        f.truncate(size)


def test_inspect_of_a_forged_expert_count_is_bounded_by_the_file(tmp_path):
    """A header claiming 2^19 experts over a sparse file (13 GB): inspect stops at the first missing header."""
    loaded(tmp_path)
    forge_expert_count(tmp_path / FILE, 1 << 19)
    t0 = time.monotonic()
    (row,) = cache.inspect_dir(tmp_path)
    seconds = time.monotonic() - t0
    assert row["experts"] == 1 << 19 and not row["valid"]
    assert row["reason"].startswith(f"corrupt: w13 expert {E} header"), row["reason"]
    assert seconds < 2, f"inspect took {seconds:.1f} s: its work follows the header's claim"
    m = loaded(tmp_path)
    assert not m.cache_hit and reason(m).startswith("stale: experts is 524288"), reason(m)
