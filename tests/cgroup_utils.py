"""Run Python code in a child process inside a fresh cgroup-v1 memory limit (tests only)."""
import os
import subprocess
import sys
import time

import pytest

CGROUP_ROOT = "/sys/fs/cgroup/memory"
needs_memory_cgroup = pytest.mark.skipif(
    not os.path.isdir(CGROUP_ROOT) or os.geteuid() != 0,
    reason="needs root and a cgroup v1 memory controller at /sys/fs/cgroup/memory")


def run_in_memory_cgroup(name, limit, code, args=(), timeout=300, env=None):
    """Runs python code (with sys.argv[1:] = args) in a fresh v1 memory cgroup limited to `limit` bytes, no swap.

    `env` adds to (or overrides) the inherited environment. Skips the calling test when the cgroup cannot be made. Returns the CompletedProcess
    (returncode -9: killed, e.g. by the cgroup's OOM killer).
    """
    path = os.path.join(CGROUP_ROOT, name)
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup under {CGROUP_ROOT}: {exc}")
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            with open(memsw, "w") as f:
                f.write(str(limit))
        wrapper = (f"import os\nopen({os.path.join(path, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                   + code)
        return subprocess.run([sys.executable, "-c", wrapper, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})})
    finally:
        for _ in range(50):
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)
