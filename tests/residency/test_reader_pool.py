"""The reader pool (csrc/arena/reader_pool.h, torch_ktmoe.residency.reads): reads of file-backed experts land in
the page cache, experts already there are not read again, no thread before the first read, threads stop at exit and a forked child reads on its own,
a read past the file's end is a recorded error (no hang), bad ids are errors, anonymous tensors do nothing,
and outputs do not depend on how the experts were read."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests.helpers import random_experts, random_routing
from torch_ktmoe import KTMoE, ops
from torch_ktmoe.residency import reads as expert_reads
from torch_ktmoe._native import _C

E, K, H, I = 16, 2, 512, 256
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _layer(directory=None, prefetch=False):
    gate_up, down = random_experts(E, H, I)
    layer = KTMoE(E, K, H, I, weight_format="int8", mmap_experts_dir=directory, numa_parts=1, prefetch=prefetch)
    layer.load_weights(gate_up, down)
    layer.join_warm()
    return layer


def _settle(timeout=20.0):
    """Waits until the pool has nothing queued or in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = expert_reads.reader_pool_stats()
        if s["queued_now"] == 0 and s["in_flight_now"] == 0:
            return s
        time.sleep(0.01)
    raise AssertionError(f"reader pool still busy after {timeout} s: {expert_reads.reader_pool_stats()}")


def _resident(layer, ids):
    w13, w2 = layer.packed_tensors()[0]
    return _C.routed_experts_resident([w13, w2], torch.tensor(ids))


def _run(code, timeout=60):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_reads_land_in_the_page_cache(tmp_path):
    layer = _layer(tmp_path)
    w13, w2 = layer.packed_tensors()[0]
    for a in layer.arenas:
        a.evict()
    assert _resident(layer, [2, 9, 15]) == (0, 3)
    before = expert_reads.reader_pool_stats()
    expert_reads.read_ahead_experts(w13, w2, torch.tensor([[9, -1], [2, 15], [9, 9]]))
    after = _settle()
    assert _resident(layer, [2, 9, 15]) == (3, 0)
    assert after["bytes_read"] - before["bytes_read"] >= 3 * (w13.size(1) + w2.size(1)) - 2 * 4096
    assert after["errors"] == before["errors"]
    assert after["threads_running"] == after["threads"] > 0


def test_experts_already_in_the_page_cache_are_not_read_again(tmp_path):
    layer = _layer(tmp_path)
    w13, w2 = layer.packed_tensors()[0]
    for a in layer.arenas:
        a.evict()
    expert_reads.read_ahead_experts(w13, w2, torch.tensor([3, 4]))
    _settle()
    assert _resident(layer, [3, 4]) == (2, 0)
    before = expert_reads.reader_pool_stats()
    expert_reads.read_ahead_experts(w13, w2, torch.tensor([3, 4, 5]))  # 3, 4 resident: only 5 is queued
    after = _settle()
    assert after["requests"] - before["requests"] == 2  # expert 5's rows of w13 and of w2
    assert after["bytes_read"] - before["bytes_read"] < 2 * (w13.size(1) + w2.size(1))
    assert _resident(layer, [3, 4, 5]) == (3, 0)
    before = expert_reads.reader_pool_stats()
    expert_reads.read_ahead_experts(w13, w2, torch.tensor([3, 4, 5]))  # all resident: nothing queued
    after = _settle()
    assert after["requests"] == before["requests"] and after["bytes_read"] == before["bytes_read"]


def test_bad_ids_and_tensors_are_errors(tmp_path):
    layer = _layer(tmp_path)
    w13, w2 = layer.packed_tensors()[0]
    with pytest.raises(RuntimeError, match=f"expert id {E} >= num_experts {E}"):
        expert_reads.read_ahead_experts(w13, w2, torch.tensor([1, E]))
    with pytest.raises(RuntimeError, match="integer"):
        expert_reads.read_ahead_experts(w13, w2, torch.tensor([1.0]))
    with pytest.raises(RuntimeError, match="w13 has 16 experts but w2 has 15"):
        expert_reads.read_ahead_experts(w13, w2[:15], torch.tensor([1]))
    with pytest.raises(RuntimeError, match="contiguous CPU uint8"):
        expert_reads.read_ahead_experts(w13.float(), w2, torch.tensor([1]))
    with pytest.raises(ValueError, match="threads must be in"):
        expert_reads.set_reader_threads(-1)


def test_anonymous_tensors_are_a_no_op():
    layer = _layer()
    w13, w2 = layer.packed_tensors()[0]
    before = expert_reads.reader_pool_stats()
    expert_reads.read_ahead_experts(w13, w2, torch.arange(E))
    after = expert_reads.reader_pool_stats()
    assert after["requests"] == before["requests"] and after["pieces_queued"] == before["pieces_queued"]


@pytest.mark.parametrize("threads", [8, 1, 0], ids=["pool8", "pool1", "willneed"])
def test_outputs_do_not_depend_on_the_reads(threads, tmp_path):
    layer = _layer(tmp_path)
    w13, w2 = layer.packed_tensors()[0]
    try:
        expert_reads.set_reader_threads(threads)
        for tokens in (1, 5, 40):
            x = torch.randn(tokens, H).bfloat16()
            ids, w = random_routing(tokens, E, K, masked=0.2)
            ref = ops.moe_forward(x, ids, w, w13, w2)
            for a in layer.arenas:
                a.evict()
            assert torch.equal(ops.moe_forward(x, ids, w, w13, w2, prefetch=True), ref)
    finally:
        expert_reads.set_reader_threads(8)


def test_warm_reads_through_the_pool(tmp_path):
    layer = _layer(tmp_path)
    (arena,) = [a for a in layer.arenas if a.file_mode]
    arena.evict()
    before = expert_reads.reader_pool_stats()
    arena.prefault(wait=True)
    after = expert_reads.reader_pool_stats()
    assert arena.prefault_status == "populate_read"
    assert arena.resident_bytes() >= arena.stats()["file_backed_bytes"]
    assert after["bytes_read"] - before["bytes_read"] >= arena.stats()["file_backed_bytes"] - (1 << 20)


def test_no_thread_before_the_first_read_and_none_after_exit(tmp_path):
    out = _run(f"""
        import atexit, os, sys, torch
        def threads():
            return sum(open(f"/proc/self/task/{{t}}/comm").read().strip() == "ktmoe-read" for t in os.listdir("/proc/self/task"))
        atexit.register(lambda: print("at exit", threads(), flush=True))  # runs after the pool's stop (LIFO)
        from tests.residency.test_reader_pool import _layer, _settle, E, H, K
        from tests.helpers import random_routing
        from torch_ktmoe.residency import reads as expert_reads
        anon = _layer(prefetch=True)
        x = torch.randn(2, H); ids, w = random_routing(2, E, K)
        anon(x, ids, w)
        print("anonymous", threads(), expert_reads.reader_pool_stats()["threads_running"])
        filed = _layer({str(tmp_path)!r})
        print("fits", threads())
        for a in filed.arenas: a.evict()
        expert_reads.read_ahead_experts(*filed.packed_tensors()[0], torch.arange(E))
        _settle()
        print("read", threads())
        """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["anonymous 0 0", "fits 0"], out.stdout
    assert lines[2] == "read 8" and lines[3] == "at exit 0", out.stdout


def test_a_forked_child_reads_with_its_own_threads(tmp_path):
    out = _run(f"""
        import os, time, torch
        from tests.residency.test_reader_pool import _layer, _settle, _resident, E
        from torch_ktmoe.residency import reads as expert_reads
        layer = _layer({str(tmp_path)!r})
        w13, w2 = layer.packed_tensors()[0]
        for a in layer.arenas: a.evict()  # not resident: read_ahead_experts queues them
        expert_reads.read_ahead_experts(w13, w2, torch.arange(E))  # the parent's threads run
        _settle()
        pid = os.fork()
        if pid == 0:
            s = expert_reads.reader_pool_stats()
            ok = s["threads_running"] == 0 and s["queued_now"] == 0
            for a in layer.arenas: a.evict()
            expert_reads.read_ahead_experts(w13, w2, torch.tensor([1, 4]))
            _settle(10)
            ok = ok and _resident(layer, [1, 4]) == (2, 0) and expert_reads.reader_pool_stats()["threads_running"] == 8
            expert_reads.stop_reader_pool()
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), expert_reads.reader_pool_stats()["threads_running"])
        """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "child 0 8", out.stdout


def test_a_truncated_file_is_a_recorded_error_not_a_hang(tmp_path):
    out = _run(f"""
        import os, torch
        from tests.residency.test_reader_pool import _layer, _settle, E
        from torch_ktmoe.residency import reads as expert_reads
        layer = _layer({str(tmp_path)!r})
        w13, w2 = layer.packed_tensors()[0]
        (arena,) = [a for a in layer.arenas if a.file_mode]
        def target(f):
            try:
                return os.readlink(f"/proc/self/fd/{{f}}")
            except OSError:  # listdir's own fd
                return ""
        fds = [f for f in os.listdir("/proc/self/fd") if target(f).startswith({str(tmp_path)!r})]
        for a in layer.arenas: a.evict()
        os.truncate(f"/proc/self/fd/{{fds[0]}}", 4096)  # the arena's file loses its experts (never touched here)
        expert_reads.read_ahead_experts(w13, w2, torch.arange(E))
        s = _settle(10)
        print(s["errors"] > 0, "end of file" in s["last_error"], flush=True)
        os._exit(0)  # the mapping is past the file's end now: no teardown that could touch it
        """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True True", out.stdout
