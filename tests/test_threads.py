"""The forward ops' threads: how many (affinity, cgroup quota, KTMOE_NUM_THREADS), and the same bits for any
thread count and schedule (the work pool, csrc/common/work_pool.h; issue 54)."""
import os
import subprocess
import threading

import pytest
import torch

import torch_ktmoe
from ktmoe_harness.child import run_python
from ktmoe_harness.moe_inputs import random_experts, random_routing
from torch_ktmoe import _C, ops

# A child computes the ops' outputs on fixed inputs and saves them to argv[1]: moe_forward in bf16 and
# int8 at T=1 (decode items split over threads) and T=40 (prefill panels), and linear at M=1 and M=40.
OUTPUTS = r"""
import sys, torch
from torch_ktmoe import _C, ops
from ktmoe_harness.moe_inputs import random_experts, random_routing
out = {"threads": _C.op_threads()}
gate_up, down = random_experts(8, 256, 192, dtype=torch.bfloat16, seed=3)
for fmt in ("bf16", "int8"):
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    for t in (1, 40):
        x = torch.randn(t, 256, generator=torch.Generator().manual_seed(t)).to(torch.bfloat16)
        ids, w = random_routing(t, 8, 3, seed=t)
        out[f"{fmt}-{t}"] = ops.moe_forward(x, ids, w, w13, w2)
lin = torch.randn(1000, 256, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
packed = torch.ops.ktmoe.pack_linear(lin)
for m in (1, 40):
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    out[f"linear-{m}"] = torch.ops.ktmoe.linear(x, packed, 1000, None)
torch.save(out, sys.argv[1])
"""


def outputs(tmp_path, name, env):
    path = tmp_path / f"{name}.pt"
    r = run_python(OUTPUTS, [path], env=env)
    assert r.returncode == 0, r.stderr
    return torch.load(path)


def test_outputs_are_bit_identical_across_thread_counts_and_busy_neighbours(tmp_path):
    runs = {n: outputs(tmp_path, f"t{n}", {"KTMOE_NUM_THREADS": str(n)}) for n in (1, 2, 3, 5)}
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        runs["busy"] = outputs(tmp_path, "busy", {"KTMOE_NUM_THREADS": "3"})
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert [runs[n]["threads"] for n in (1, 2, 3, 5)] == [1, 2, 3, 5]
    ref = runs[1]
    for name, out in runs.items():
        for key, value in ref.items():
            if key != "threads":
                assert torch.equal(out[key], value), (name, key)


def test_threads_follow_torch_capped_by_the_affinity_mask():
    code = r"""
import os, torch
from torch_ktmoe import _C
torch.set_num_threads(2)
two = _C.op_threads()
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
print(two, _C.op_threads(), _C.thread_report()["affinity_cpus"])
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    two, pinned, affinity = map(int, r.stdout.split())
    assert two == min(2, len(os.sched_getaffinity(0)))
    assert (pinned, affinity) == (1, 1)


def test_the_override_wins():
    r = run_python("import torch; from torch_ktmoe import _C; torch.set_num_threads(1); "
                   "print(_C.op_threads(), _C.thread_report()['override'])", env={"KTMOE_NUM_THREADS": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "3"]


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_is_the_smallest_on_the_path(tmp_path):
    _write(tmp_path, "cpu.max", "max 100000\n")
    _write(tmp_path, "a/cpu.max", "150000 100000\n")
    _write(tmp_path, "a/b/cpu.max", "400000 100000\n")
    assert _C.cgroup_cpu_quota(str(tmp_path), "0::/a/b\n") == pytest.approx(1.5)
    assert _C.cgroup_cpu_quota(str(tmp_path), "0::/\n") == 0
    _write(tmp_path, "a/cpu.max", "max 100000\n")
    assert _C.cgroup_cpu_quota(str(tmp_path), "0::/a/b\n") == pytest.approx(4.0)


def test_cgroup_v1_and_hybrid_quotas(tmp_path):
    v1 = "12:memory:/x\n4:cpu,cpuacct:/job\n0::/job\n"
    _write(tmp_path, "cpu,cpuacct/job/cpu.cfs_quota_us", "250000\n")
    _write(tmp_path, "cpu,cpuacct/job/cpu.cfs_period_us", "100000\n")
    assert _C.cgroup_cpu_quota(str(tmp_path), v1) == pytest.approx(2.5)
    _write(tmp_path, "cpu,cpuacct/job/cpu.cfs_quota_us", "-1\n")
    assert _C.cgroup_cpu_quota(str(tmp_path), v1) == 0
    _write(tmp_path, "unified/job/cpu.max", "50000 100000\n")  # hybrid: v2 beside v1
    assert _C.cgroup_cpu_quota(str(tmp_path), v1) == pytest.approx(0.5)
    # a container's own cgroup mounted at the root while /proc/self/cgroup names the host's path
    _write(tmp_path, "cpu/cpu.cfs_quota_us", "300000\n")
    _write(tmp_path, "cpu/cpu.cfs_period_us", "100000\n")
    assert _C.cgroup_cpu_quota(str(tmp_path), "3:cpu:/docker/abc\n") == pytest.approx(3.0)
    assert _C.cgroup_cpu_quota(str(tmp_path / "missing"), v1) == 0


def test_concurrent_callers_and_a_forked_child_get_the_same_bits():
    gate_up, down = random_experts(8, 128, 96, dtype=torch.bfloat16)
    w13, w2 = ops.pack_experts(gate_up, down, "bf16")
    x = torch.randn(3, 128).to(torch.bfloat16)
    ids, w = random_routing(3, 8, 2)
    ref = ops.moe_forward(x, ids, w, w13, w2)
    got = []

    def call():
        for _ in range(20):
            got.append(ops.moe_forward(x, ids, w, w13, w2))

    callers = [threading.Thread(target=call) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(got) == 60 and all(torch.equal(g, ref) for g in got)
    pid = os.fork()  # the child has none of the pool's workers: it must start its own, not hang
    if pid == 0:
        os._exit(0 if torch.equal(ops.moe_forward(x, ids, w, w13, w2), ref) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_info_reports_threads():
    from torch_ktmoe.threads import thread_lines

    text = "\n".join(thread_lines())
    assert "threads" in text and "OMP_WAIT_POLICY" in text
    assert torch_ktmoe.threads.op_threads() >= 1


# Many short jobs whose chunk counts alternate (a linear with 1 and 40 rows, 256 and 4096 outputs), on more
# threads than cores beside busy processes: workers arrive late, into the next job. Every output must match
# the one-thread result.
STRESS = r"""
import torch
from torch_ktmoe import _C
torch.manual_seed(0)
cases = []
for n in (256, 4096):
    packed = torch.ops.ktmoe.pack_linear(torch.randn(n, 512).to(torch.bfloat16))
    for m in (1, 40):
        cases.append((torch.randn(m, 512).to(torch.bfloat16), packed, n))
ref = torch.load(__import__("sys").argv[1]) if len(__import__("sys").argv) > 2 else None
outs = [torch.ops.ktmoe.linear(x, p, n, None) for x, p, n in cases]
if ref is None:
    torch.save(outs, __import__("sys").argv[1])
else:
    for i in range(3000):
        x, p, n = cases[i % 4]
        assert torch.equal(torch.ops.ktmoe.linear(x, p, n, None), ref[i % 4]), i
    print("ok", _C.op_threads())
"""


def test_many_short_jobs_with_late_workers(tmp_path):
    ref = tmp_path / "ref.pt"
    r = run_python(STRESS, [ref], env={"KTMOE_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        r = run_python(STRESS, [ref, "check"], env={"KTMOE_NUM_THREADS": "4", "KTMOE_POOL_SPIN_US": "0"})
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "4"]


def test_launchers_start_their_processes_with_passive_waits(monkeypatch):
    import runpy
    import subprocess as sp

    import torch_ktmoe.cli as cli
    import torch_ktmoe.sglang.__main__ as launcher

    monkeypatch.setenv("OMP_WAIT_POLICY", "")  # records the original state, restored after the test
    monkeypatch.delenv("OMP_WAIT_POLICY")
    seen = {}
    monkeypatch.setattr(sp, "call", lambda cmd, env: seen.setdefault("demo", env["OMP_WAIT_POLICY"]) and 0)
    assert cli.main(["demo", "--tokens", "2"]) == 0
    monkeypatch.setattr(launcher, "install_wrapper", lambda: None)
    monkeypatch.setattr(runpy, "run_module", lambda *a, **k: seen.setdefault("sglang", os.environ["OMP_WAIT_POLICY"]))
    launcher.main(["--model-path", "m"])
    assert seen == {"demo": "PASSIVE", "sglang": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a policy the user set wins
    from torch_ktmoe.threads import passive_env

    assert passive_env()["OMP_WAIT_POLICY"] == "ACTIVE"
    assert passive_env({})["OMP_WAIT_POLICY"] == "PASSIVE"
