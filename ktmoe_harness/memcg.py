"""Run a child process inside a fresh cgroup-v1 memory limit (root only).

Used by the bigger-than-RAM test and benchmark to prove behaviour under memory
pressure: anonymous memory without swap cannot be reclaimed (the cgroup's OOM
killer ends the child, returncode -9), clean file-backed pages can.
"""
import contextlib
import os
import subprocess
import time

from ktmoe_harness.child import run_python

CGROUP_ROOT = "/sys/fs/cgroup/memory"


class MemoryCgroupUnavailable(OSError):
    """A v1 memory cgroup cannot be created here (not root, cgroup v2 only, ...)."""


def memory_cgroup_available() -> bool:
    return os.path.isdir(CGROUP_ROOT) and os.geteuid() == 0


@contextlib.contextmanager
def memory_cgroup(name, limit):
    """A new v1 memory cgroup ``CGROUP_ROOT/name`` of `limit` bytes, no swap; yields its path.

    Raises MemoryCgroupUnavailable when it cannot be made; removed after (once its processes
    are reaped)."""
    path = os.path.join(CGROUP_ROOT, name)
    try:
        os.mkdir(path)
    except OSError as exc:
        raise MemoryCgroupUnavailable(f"cannot create a memory cgroup under {CGROUP_ROOT}: {exc}") from exc
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            with open(memsw, "w") as f:
                f.write(str(limit))
        yield path
    finally:
        for _ in range(100):  # the cgroup empties once the child is reaped
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)


def join_code(path) -> str:
    """Python lines that move the process running them into the cgroup at `path`."""
    return f"import os\nopen({os.path.join(path, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"


def cgroup_stats(path) -> dict:
    """The cgroup's peak usage, limit hits and OOM state (raw text of each file that reads)."""
    stats = {}
    for key in ("memory.max_usage_in_bytes", "memory.failcnt", "memory.oom_control"):
        try:
            with open(os.path.join(path, key)) as f:
                stats[key] = f.read().strip()
        except OSError:
            pass
    return stats


def run_in_memory_cgroup(name, limit, code, args=(), timeout=300, env=None) -> subprocess.CompletedProcess:
    """Runs python `code` (sys.argv[1:] = args) in a new v1 memory cgroup of `limit` bytes, no swap.

    As child.run_python (output captured, PYTHONPATH = this sys.path, `env` added), but the
    child joins the cgroup before running `code` (see memory_cgroup).
    """
    with memory_cgroup(name, limit) as path:
        return run_python(join_code(path) + code, args, timeout=timeout, env=env)
