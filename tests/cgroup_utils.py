"""pytest face of ktmoe_harness.memcg: skip (with the reason) where a memory cgroup cannot be made."""
import pytest

from ktmoe_harness.memcg import CGROUP_ROOT, MemoryCgroupUnavailable, memory_cgroup_available
from ktmoe_harness.memcg import run_in_memory_cgroup as _run

needs_memory_cgroup = pytest.mark.skipif(
    not memory_cgroup_available(),
    reason=f"needs root and a cgroup v1 memory controller at {CGROUP_ROOT}")


def run_in_memory_cgroup(name, limit, code, args=(), timeout=300, env=None):
    """ktmoe_harness.memcg.run_in_memory_cgroup, skipping the test when no cgroup can be made."""
    try:
        return _run(name, limit, code, args, timeout, env)
    except MemoryCgroupUnavailable as exc:
        pytest.skip(str(exc))
