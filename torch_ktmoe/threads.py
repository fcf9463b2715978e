"""Threads on shared cores: how many the forward ops use, and torch's OpenMP wait policy (docs/threads.md).

* The MoE and packed-linear ops run on the library's own work pool (csrc/common/work_pool.h): threads
  that take work dynamically, spin briefly and then sleep, and a caller that never waits for a thread
  that has not arrived. Their count: ``KTMOE_NUM_THREADS`` when set, else ``min(torch.get_num_threads(),
  usable CPUs)``, the usable CPUs being the affinity mask capped by the cgroup's CPU quota.
* torch's own parallel regions (attention, norms, anything not ours) run on libgomp, whose waiting
  threads spin unless ``OMP_WAIT_POLICY=PASSIVE`` was in the environment when torch was loaded; libgomp
  reads it once, so nothing can change it afterwards. On shared cores the spinning costs a decode step
  its timeslices (issue 54: 0.02-0.3x the quiet speed beside two busy processes on 2 cores).
  :func:`passive_env` is what the command line's child processes, the demo and the sglang launcher set.
"""
import os

from . import _C

WAIT_POLICY = "OMP_WAIT_POLICY"
# The environment's wait policy when torch_ktmoe was imported (torch is imported first, so this is what
# libgomp read unless the variable was changed between the two imports).
_POLICY_AT_IMPORT = os.environ.get(WAIT_POLICY)


def op_threads() -> int:
    """Threads of the next forward op (KTMOE_NUM_THREADS, else min(torch.get_num_threads(), usable CPUs))."""
    return _C.op_threads()


def thread_report() -> dict:
    """``threads``, ``torch_threads``, ``usable_cpus``, ``affinity_cpus``, ``cgroup_cpu_quota`` (CPUs, 0: none),
    ``override`` (KTMOE_NUM_THREADS, 0: unset), ``pool_workers`` (started so far)."""
    return dict(_C.thread_report())


def spinning_waits() -> bool:
    """True when torch's OpenMP threads spin-wait: OMP_WAIT_POLICY was not PASSIVE when torch was loaded."""
    return (_POLICY_AT_IMPORT or "").strip().lower() != "passive"


def passive_env(env=None) -> dict:
    """`env` (default os.environ) with OMP_WAIT_POLICY=PASSIVE unless it sets a policy: for child processes."""
    env = dict(os.environ if env is None else env)
    env.setdefault(WAIT_POLICY, "PASSIVE")
    return env


def thread_lines() -> list:
    """What ``python -m torch_ktmoe info`` prints about threads."""
    r = thread_report()
    quota = f"{r['cgroup_cpu_quota']:g}" if r["cgroup_cpu_quota"] else "none"
    source = (f"KTMOE_NUM_THREADS={r['override']}" if r["override"] else
              f"min(torch {r['torch_threads']}, usable CPUs {r['usable_cpus']}: affinity {r['affinity_cpus']}, "
              f"cgroup quota {quota})")
    lines = [f"threads     {r['threads']} for the MoE and linear ops = {source}; "
             f"torch's own ops {r['torch_threads']} (torch.set_num_threads / OMP_NUM_THREADS)"]
    if spinning_waits():
        lines.append(f"OMP_WAIT_POLICY {_POLICY_AT_IMPORT or 'unset'}: torch's OpenMP threads spin-wait; on shared "
                     "cores set OMP_WAIT_POLICY=PASSIVE before starting Python (docs/threads.md)")
    else:
        lines.append("OMP_WAIT_POLICY PASSIVE: torch's OpenMP threads sleep while they wait")
    return lines
