"""Whether a forward's routing names most of a layer's experts: the one test that tells a prefill from a decode.

A forward routed to at least 3/4 of its layer's experts (a prefill's union, or a prediction of one) reads its layer
faster mapped whole (its faults, or :meth:`ExpertsDir.stream`) than expert by expert. The cheap bound comes first (a
decode's ``T * k`` ids cannot name 3/4 of the experts: no call into the extension), then the exact count of distinct
ids (``_C.routed_to_most``). The op's own ``prefetch`` skip (``csrc/ops/expert_reads.h``) makes the same test in C++.
"""
import torch

from .._native import _C

MOST = (3, 4)  # "most": at least 3/4 of the experts


def routed_to_most(num_experts: int, expert_ids: torch.Tensor) -> bool:
    """Whether ``expert_ids`` (any shape; ids < 0 skipped) name at least 3/4 of ``num_experts`` distinct experts."""
    if expert_ids.numel() * MOST[1] < num_experts * MOST[0]:
        return False
    return bool(_C.routed_to_most(num_experts, expert_ids))
