"""Packed weights in anonymous memory ask for transparent huge pages (common/huge_pages.h).

The advice is visible as the ``hg`` flag (VM_HUGEPAGE) of the mapping in /proc/self/smaps, whatever the
kernel then gives: that is what these tests check. Whether 2 MiB pages arrive depends on THP's mode and
free memory; the speed it buys is measured by benchmarks/memory/bench_huge_pages.py, not here.
"""
import os

import pytest
import torch

from torch_ktmoe import ops
from torch_ktmoe.arena import WeightArena



def _smaps_shows_vm_flags() -> bool:
    try:
        with open("/proc/self/smaps") as f:
            return any(line.startswith("VmFlags:") for line in f)
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not (os.path.isdir("/sys/kernel/mm/transparent_hugepage") and _smaps_shows_vm_flags()),
                                reason="needs Linux with transparent huge pages and VmFlags in /proc/self/smaps")

MIB = 1 << 20


def vm_flags(addr: int) -> set:
    """The VmFlags of the mapping of this process that holds ``addr``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


def middle(t: torch.Tensor) -> int:
    return t.data_ptr() + t.numel() * t.element_size() // 2


def test_pack_experts_outputs_are_advised():
    gate_up = torch.randn(2, 2048, 1024, dtype=torch.bfloat16)  # 4 MiB packed per expert
    down = torch.randn(2, 1024, 1024, dtype=torch.bfloat16)
    w13, w2 = ops.pack_experts(gate_up, down, "bf16")
    assert w13.numel() >= 8 * MIB
    assert "hg" in vm_flags(middle(w13))
    assert "hg" in vm_flags(middle(w2))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_outputs_are_advised_and_unchanged(fmt):
    """The advice changes where the bytes live, never what they are: a copy on plain pages packs alike."""
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(4, 2048, 2048, generator=g).to(torch.bfloat16)
    down = torch.randn(4, 2048, 1024, generator=g).to(torch.bfloat16)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    assert "hg" in vm_flags(middle(w13))
    x = torch.randn(3, 2048, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    w = torch.full((3, 2), 0.5)
    plain13, plain2 = w13.clone(), w2.clone()  # torch's allocator: no advice
    assert torch.equal(torch.ops.ktmoe.moe_forward(x, ids, w, w13, w2),
                       torch.ops.ktmoe.moe_forward(x, ids, w, plain13, plain2))


def test_pack_linear_output_is_advised():
    packed = ops.pack_linear(torch.randn(4096, 1024, dtype=torch.bfloat16))  # 8 MiB
    assert "hg" in vm_flags(middle(packed))


def test_anonymous_arena_advises_large_allocations():
    arena = WeightArena(None, "huge_pages_test")
    t = arena.empty(6 * MIB)
    assert t.data_ptr() % (2 * MIB) == 0
    t.fill_(1)
    assert "hg" in vm_flags(middle(t))


def test_anonymous_arena_without_hugepage_leaves_the_advice_off():
    arena = WeightArena(None, "huge_pages_test_off", hugepage=False)
    t = arena.empty(6 * MIB)
    t.fill_(1)
    assert "hg" not in vm_flags(middle(t))


def test_huge_page_tensors_behave_as_torch_tensors(tmp_path):
    """The pack ops' outputs own a mapping of their own: save, load, deepcopy and share_memory_ still work."""
    import copy

    w13, _ = ops.pack_experts(torch.randn(2, 2048, 1024).to(torch.bfloat16),
                              torch.randn(2, 1024, 1024).to(torch.bfloat16), "int8")
    want = w13.clone()
    assert torch.equal(copy.deepcopy(w13), want)
    torch.save({"w13": w13}, tmp_path / "w.pt")
    assert torch.equal(torch.load(tmp_path / "w.pt")["w13"], want)
    w13.share_memory_()
    assert w13.is_shared() and torch.equal(w13, want)
