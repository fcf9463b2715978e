"""The cache lock: created 0600, refused when another user owns it, waited for only until a deadline
(KTMOE_CACHE_LOCK_WAIT), so that no other process, running or stopped, can stall a load."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch

from tests.helpers import random_experts, random_routing
from torch_ktmoe import KTMoE, cache
from torch_ktmoe.arena import CacheLockWarning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E, H, I, K = 4, 64, 96, 2
FILE = "layer0000.part0.ktmoe"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file to another user")


def loaded(directory, **kwargs):
    m = KTMoE(E, K, H, I, weight_format="int8", mmap_experts_dir=directory, numa_parts=1, **kwargs)
    m.load_weights(*random_experts(E, H, I))
    return m


def run(m):
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    return m(x, *random_routing(5, E, K))


def hold_lock(path) -> subprocess.Popen:
    """A child process that holds flock on path until killed (it prints "held" once it does); it makes the
    lock file 0600 as a load does (one others can open would be replaced)."""
    code = textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def load_in_child(directory, timeout: float = 60) -> str:
    """Loads a layer in a new interpreter with a 1 s lock deadline; its output (a hang fails the test)."""
    code = textwrap.dedent(f"""
        import sys, time, warnings
        sys.path.insert(0, {ROOT!r})
        from tests.test_cache_lock import loaded
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = loaded({str(directory)!r})
        print("SECONDS", time.monotonic() - t0)
        print("REASON", m.cache_events[0]["reason"])
        print("WARNINGS", [type(w.message).__name__ for w in caught])
        print("FILE_BACKED", m.file_backed_bytes)
    """)
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, KTMOE_CACHE_LOCK_WAIT="1"))
    except subprocess.TimeoutExpired:
        pytest.fail("the load waited on the lock past its deadline")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_lock_held_by_another_process_does_not_stall_the_load(tmp_path, stopped):
    holder = hold_lock(tmp_path / (FILE + ".lock"))
    try:
        if stopped:
            os.kill(holder.pid, signal.SIGSTOP)
        out = load_in_child(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    seconds = float(out.split("SECONDS ")[1].split()[0])
    assert seconds < 20, out  # the 1 s deadline, plus packing on a busy host
    assert "REASON lock busy: another process held" in out and "CacheLockWarning" in out, out
    assert "FILE_BACKED 0" not in out  # still file-backed: an unnamed file
    assert not (tmp_path / FILE).exists()  # nothing kept while another process may be building


def test_lock_wait_is_settable_and_warns_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("KTMOE_CACHE_LOCK_WAIT", "0.2")
    holder = hold_lock(tmp_path / (FILE + ".lock"))
    try:
        t0 = time.monotonic()
        with pytest.warns(CacheLockWarning, match="lock busy"):
            m = loaded(tmp_path)
        assert time.monotonic() - t0 < 20
    finally:
        holder.kill()
        holder.wait()
    assert not m.cache_hit and m.cache_events[0]["reason"].startswith("lock busy")
    assert torch.equal(run(m), run(loaded(None)))
    assert loaded(tmp_path).cache_events[0]["reason"] == "missing"  # the lock is free again: built and kept
    assert loaded(tmp_path).cache_hit


def test_lock_file_is_created_0600(tmp_path):
    loaded(tmp_path)
    assert os.stat(tmp_path / (FILE + ".lock")).st_mode & 0o777 == 0o600


@root_only
def test_lock_file_of_another_user_is_refused(tmp_path):
    ref = run(loaded(tmp_path))
    lock = tmp_path / (FILE + ".lock")
    os.chown(lock, 65534, 65534)
    m = loaded(tmp_path)
    reason = m.cache_events[0]["reason"]
    assert not m.cache_hit and reason.startswith("untrusted: lock file") and "65534" in reason, reason
    assert torch.equal(run(m), ref) and m.file_backed_bytes > 0
    assert os.stat(lock).st_uid == 65534  # used as nothing, changed in nothing
    assert loaded(tmp_path, cache_trust_others=True).cache_hit  # the caller opted in


def test_world_writable_lock_file_is_refused(tmp_path):
    loaded(tmp_path)
    os.chmod(tmp_path / (FILE + ".lock"), 0o666)
    m = loaded(tmp_path)
    assert not m.cache_hit and "writable by others" in m.cache_events[0]["reason"]
    assert cache.leftover_temp_files(tmp_path) == []


@pytest.mark.parametrize("wait", ["inf", "1e10"])
def test_a_lock_wait_too_long_for_a_deadline_waits_for_the_holder(tmp_path, wait):
    """inf (or 1e10 s, past what a clock's nanoseconds hold) waits as long as the lock is held: the load
    then builds and keeps the file (it gave up at once when the seconds overflowed)."""
    holder = hold_lock(tmp_path / (FILE + ".lock"))
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from tests.helpers.cache_layer import loaded, reason
        print("REASON", reason(loaded({str(tmp_path)!r})))
    """)
    try:
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=dict(os.environ, KTMOE_CACHE_LOCK_WAIT=wait))
        time.sleep(3)
        assert child.poll() is None, child.communicate()  # still waiting for the holder
    finally:
        holder.kill()
        holder.wait()
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and "REASON missing" in out, out + err
    assert (tmp_path / FILE).exists()


@pytest.mark.parametrize("wait", ["abc", "-1", "nan", "5s"])
def test_a_lock_wait_that_is_no_number_of_seconds_is_refused_by_name(tmp_path, monkeypatch, wait):
    monkeypatch.setenv("KTMOE_CACHE_LOCK_WAIT", wait)
    with pytest.raises(ValueError, match=rf"KTMOE_CACHE_LOCK_WAIT='{wait}': expected a number of seconds >= 0"):
        loaded(tmp_path)


def hold_lock_as_another_user(path) -> subprocess.Popen:
    """A child process of uid 65534 that opens ``path`` read-only and holds flock on it until killed."""
    code = textwrap.dedent(f"""
        import fcntl, os, time
        os.setgid(65534)
        os.setuid(65534)
        f = open({str(path)!r}, "rb")  # a 0644 file: any user may open it, and flock needs no write access
        fcntl.flock(f, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@root_only
def test_a_lock_file_others_can_open_is_replaced_by_a_private_one(monkeypatch):
    """A 0644 lock file (left by a release before locks were 0600) that another user holds: replaced, so the
    load neither waits nor loses the valid cache file."""
    monkeypatch.setenv("KTMOE_CACHE_LOCK_WAIT", "1")
    directory = tempfile.mkdtemp(prefix="ktmoe-lock-")  # tmp_path's parents are root's alone (0700)
    try:
        os.chmod(directory, 0o755)
        ref = run(loaded(directory))
        lock = os.path.join(directory, FILE + ".lock")
        os.chmod(lock, 0o644)
        holder = hold_lock_as_another_user(lock)
        try:
            m = loaded(directory)
        finally:
            holder.kill()
            holder.wait()
        assert m.cache_hit, m.cache_events
        assert torch.equal(run(m), ref)
        assert os.stat(lock).st_mode & 0o777 == 0o600
        assert sorted(os.listdir(directory)) == [FILE, FILE + ".lock"]
    finally:
        shutil.rmtree(directory)
