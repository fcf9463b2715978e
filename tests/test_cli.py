"""``python -m torch_ktmoe pack`` and ``inspect`` on bad input: one line on stderr, exit code 2, nothing created."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid

import pytest

pytest.importorskip("transformers")

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.cli import pack as cli_pack  # noqa: E402
from torch_ktmoe.__main__ import main  # noqa: E402
from tests.helpers import root_only  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tests.helpers.hf_models import make_model

    path = tmp_path_factory.mktemp("ckpt") / "qwen3_moe"
    make_model("qwen3_moe").save_pretrained(path)
    return path


@pytest.fixture
def no_load(monkeypatch):
    """pack must refuse before it loads anything or asks the hub."""
    import huggingface_hub

    def fail(*a, **k):
        pytest.fail("pack loaded the model / asked the hub before refusing")

    monkeypatch.setattr(hf, "from_pretrained", fail)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)


def pack(capsys, *argv):
    rc = main(["pack", *map(str, argv), "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_refusal(rc, err, *words):
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.startswith("pack:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_output_that_is_a_file(checkpoint, tmp_path, capsys, no_load):
    target = tmp_path / "afile"
    target.write_text("mine")
    rc, _, err = pack(capsys, checkpoint, target)
    one_line_refusal(rc, err, "exists and is not a directory")
    assert target.read_text() == "mine"


@pytest.mark.parametrize("name", ["modle", "models/qwen3-moe", "./models/qwen3"])
def test_mistyped_local_directory_is_not_a_hub_id(tmp_path, capsys, no_load, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    rc, _, err = pack(capsys, name, "out")
    one_line_refusal(rc, err, "does not exist", repr(name))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt,group", [("int4", 48), ("int4", -32), ("bf16", 64), ("int8", 40)])
def test_group_size_checked_before_loading(checkpoint, tmp_path, capsys, no_load, fmt, group):
    rc = main(["pack", str(checkpoint), str(tmp_path / "out"), "--format", fmt, "--group-size", str(group)])
    one_line_refusal(rc, capsys.readouterr().err, "--group-size")
    assert not (tmp_path / "out").exists()


def test_checkpoint_that_is_a_packed_directory_or_has_no_safetensors(checkpoint, tmp_path, capsys, no_load):
    packed = tmp_path / "packed"
    shutil.copytree(checkpoint, packed)
    (packed / "ktmoe_packed.json").write_text("{}")
    rc, _, err = pack(capsys, packed, tmp_path / "out")
    one_line_refusal(rc, err, "is a packed model directory", "nothing to pack")
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = pack(capsys, empty, tmp_path / "out")
    one_line_refusal(rc, err, "has no *.safetensors")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out", ["under_a_file", "empty", "not_utf8"])
def test_output_that_cannot_be_made(checkpoint, tmp_path, capsys, no_load, out):
    (tmp_path / "afile").write_text("mine")
    target = {"under_a_file": str(tmp_path / "afile" / "sub"), "empty": "",
              "not_utf8": os.fsdecode(os.path.join(os.fsencode(tmp_path), b"out\xff"))}[out]
    rc, _, err = pack(capsys, checkpoint, target)
    one_line_refusal(rc, err, {"under_a_file": "afile' is not a directory", "empty": "DIR is empty",
                               "not_utf8": "DIR b'"}[out])
    assert os.listdir(tmp_path) == ["afile"]


def test_checkpoint_path_that_is_not_utf8(checkpoint, tmp_path, capsys, no_load):
    src = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"ckpt\xff"))
    shutil.copytree(checkpoint, src)
    rc, _, err = pack(capsys, src, tmp_path / "out")
    one_line_refusal(rc, err, "checkpoint directory b'", "is not a valid UTF-8 path")
    assert not (tmp_path / "out").exists()


def test_fifo_shard_is_refused_without_blocking(checkpoint, tmp_path):
    """A FIFO named *.safetensors: pack's header read goes through the checkpoint files' one opener."""
    src = tmp_path / "ckpt"
    shutil.copytree(checkpoint, src)
    os.mkfifo(src / "zz-pipe.safetensors")
    try:
        r = subprocess.run([sys.executable, "-m", "torch_ktmoe", "pack", str(src), str(tmp_path / "out")],
                           env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("pack blocked on a FIFO named *.safetensors")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "zz-pipe.safetensors' is not a regular file; nothing was packed" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


UNREADABLE_CHILD = textwrap.dedent("""
    import os, sys
    import torch_ktmoe.checkpoint.files, torch_ktmoe.cli.pack, torch_ktmoe.hf.packed_manifest, torch_ktmoe.ops
    import torch_ktmoe.paths
    from torch_ktmoe.__main__ import main  # everything pack imports, before root is dropped (the checkout may
    # lie in a directory only root can read, e.g. one made by mktemp -d)
    os.setgid(65534)
    os.setuid(65534)
    sys.exit(main(["pack", sys.argv[1], sys.argv[2], "--quiet"]))
""")


@root_only
@pytest.mark.parametrize("what", ["directory", "shard"])
def test_unreadable_checkpoint_is_one_line(checkpoint, what):
    base = tempfile.mkdtemp(prefix="ktmoe-unreadable-")  # tmp_path's parents are root's alone (0700)
    try:
        os.chmod(base, 0o755)
        src, out = os.path.join(base, "ckpt"), os.path.join(base, "out")
        shutil.copytree(checkpoint, src)
        os.mkdir(out)
        os.chown(out, 65534, 65534)
        os.chmod(src if what == "directory" else os.path.join(src, "model.safetensors"), 0)
        r = subprocess.run([sys.executable, "-c", UNREADABLE_CHILD, src, out], env=dict(os.environ, PYTHONPATH=ROOT),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1 and "cannot be read: Permission denied" in r.stderr, r.stderr
        assert os.listdir(out) == []
    finally:
        shutil.rmtree(base)


def test_hub_failure_is_one_line_and_creates_nothing(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    def offline(*a, **k):
        raise OSError("Got: ConnectError: [Errno -2] Name or service not known\nmore detail")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    rc, _, err = pack(capsys, "no-such-org/no-such-model", "out")
    one_line_refusal(rc, err, "cannot download 'no-such-org/no-such-model'", "ConnectError")
    assert not (tmp_path / "out").exists()


def test_load_failure_is_one_line_and_removes_the_directory_it_made(checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.down_proj.weight"]  # found only when layer 1 streams
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    rc, _, err = pack(capsys, broken, tmp_path / "out")
    one_line_refusal(rc, err, "experts.3.down_proj", "nothing was kept")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def ext4(tmp_path):
    """``ext4(mib)``: a small ext4 file system mounted for the test (skips where one cannot be made)."""
    mounted = []

    def make(mib: int):
        if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
            pytest.skip("needs root and mkfs.ext4 to make a small file system")
        img, mnt = tmp_path / f"fs{mib}.img", tmp_path / f"mnt-{uuid.uuid4().hex[:8]}"
        mnt.mkdir()
        made = subprocess.run(f"truncate -s {mib}M {img} && mkfs.ext4 -q -m 0 {img} && mount -o loop {img} {mnt}",
                              shell=True, capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount a loop file system here: {made.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def small_ext4(ext4):
    """8 MiB (6.3 MiB free): the tiny checkpoint's two bf16 cache files need 8 MiB."""
    return ext4(8)


def test_full_disk_refused_up_front(checkpoint, small_ext4, capsys, no_load):
    rc, _, err = pack(capsys, checkpoint, small_ext4 / "out")
    one_line_refusal(rc, err, "MiB free", "need at least 8.0 MiB")
    assert os.listdir(small_ext4) == ["lost+found"]


def test_disk_filling_up_names_enospc(checkpoint, small_ext4, capsys, monkeypatch):
    monkeypatch.setattr(cli_pack, "free_bytes", lambda d: 1 << 40)  # past the up-front check: the disk fills
    rc, out, err = pack(capsys, checkpoint, small_ext4 / "out")
    assert rc == 1 and "kept 1 of 2 cache files" in out, (out, err)
    assert "pack: layer0001.part0 was not kept: " in err and "No space left on device" in err, err
    assert "is not in the file" not in err


def test_repack_counts_the_space_of_the_files_it_replaces(checkpoint, ext4, capsys):
    fs = ext4(16)  # 14 MiB free: the first pack leaves ~6 MiB, the second replaces its files one by one
    assert pack(capsys, checkpoint, fs / "out")[0] == 0
    rc, out, err = pack(capsys, checkpoint, fs / "out")
    assert rc == 0 and "kept 2 of 2" in out, (out, err)


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    (tmp_path / "afile").write_text("x")
    r = subprocess.run([sys.executable, "-m", "torch_ktmoe", "pack", str(tmp_path / "afile"), str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "is not a directory" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


# -- inspect ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["missing", "file", "packed", "bad_manifest", "escaping_manifest"])
def test_inspect_never_tracebacks(checkpoint, tmp_path, capsys, what):
    target = tmp_path / "x"
    if what == "file":
        target.write_bytes(b"\x00junk")
    elif what != "missing":
        model = hf.from_pretrained(checkpoint, weight_format="int8", progress=False)
        hf.save_packed(model, target)
        if what == "bad_manifest":
            (target / "ktmoe_packed.json").write_text("{nope")
        elif what == "escaping_manifest":
            (target / "ktmoe_packed.json").write_text(
                (target / "ktmoe_packed.json").read_text().replace('"experts_dir": "experts"', '"experts_dir": "../e"'))
    capsys.readouterr()
    rc = main(["inspect", str(target)])
    out, err = capsys.readouterr()
    if what == "packed":
        assert rc == 0 and "packed model directory: 2 experts layers" in out and "2 files, 2 valid" in out, out
    else:
        assert rc == 2 and err.startswith("inspect: ") and len(err.splitlines()) == 1, err


def test_int8_takes_a_group_size(checkpoint, tmp_path):
    cli_pack.check(str(checkpoint), str(tmp_path / "out"), "int8", 32)  # a scale per (row, 32 inputs): accepted


def test_inspect_names_that_are_not_utf8(tmp_path, capsys):
    bad_dir = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"d\xff"))
    os.mkdir(bad_dir)
    rc = main(["inspect", bad_dir])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("inspect: ") and len(err.splitlines()) == 1, err
    assert "is not a valid UTF-8 path" in err, err
    (tmp_path / "d").mkdir()
    with open(os.path.join(os.fsencode(tmp_path), b"d/x\xff.ktmoe"), "wb") as f:
        f.write(b"junk")
    rc = main(["inspect", str(tmp_path / "d")])
    out, err = capsys.readouterr()
    (row,) = [line for line in out.splitlines() if ".ktmoe" in line]
    assert rc == 0 and "1 files, 0 valid" in out, out + err
    assert row.startswith("x\\xff.ktmoe ") and "is not a valid UTF-8 path" in row, row
    assert "Invoked with" not in out and "incompatible function arguments" not in out, out
