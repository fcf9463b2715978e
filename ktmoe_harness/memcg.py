"""Run a Python child process inside a fresh cgroup-v1 memory limit (root only).

Used by the bigger-than-RAM test and benchmark to prove behaviour under memory
pressure: anonymous memory without swap cannot be reclaimed (the cgroup's OOM
killer ends the child, returncode -9), clean file-backed pages can.
"""
import os
import subprocess
import time

from ktmoe_harness.child import run_python

CGROUP_ROOT = "/sys/fs/cgroup/memory"


class MemoryCgroupUnavailable(OSError):
    """A v1 memory cgroup cannot be created here (not root, cgroup v2 only, ...)."""


def memory_cgroup_available() -> bool:
    return os.path.isdir(CGROUP_ROOT) and os.geteuid() == 0


def run_in_memory_cgroup(name, limit, code, args=(), timeout=300, env=None) -> subprocess.CompletedProcess:
    """Runs python `code` (sys.argv[1:] = args) in a new v1 memory cgroup of `limit` bytes, no swap.

    As child.run_python (output captured, PYTHONPATH = this sys.path, `env` added), but the
    child joins the cgroup before running `code`. Raises MemoryCgroupUnavailable when the
    cgroup cannot be made; removes it after.
    """
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
        join = f"import os\nopen({os.path.join(path, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        return run_python(join + code, args, timeout=timeout, env=env)
    finally:
        for _ in range(50):  # the cgroup empties once the child is reaped
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)
