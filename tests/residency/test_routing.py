"""routed_to_most (torch_ktmoe.residency.routing): the one Python test of "routed to most experts" (a prefill), the
cheap bound first, then the extension's exact count; it answers as _C.routed_to_most does."""
import torch

from torch_ktmoe._native import _C
from torch_ktmoe.residency.routing import routed_to_most


def test_three_quarters_of_the_distinct_ids():
    assert routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, 5]]))  # 6 of 8
    assert not routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, 4]]))  # 5 distinct
    assert not routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, -1]]))  # ids < 0 skipped
    assert not routed_to_most(8, torch.empty(0, 2, dtype=torch.long))


def test_a_decode_never_reaches_the_extension(monkeypatch):
    calls = []
    monkeypatch.setattr(_C, "routed_to_most", lambda *a: calls.append(a) or True, raising=False)
    assert not routed_to_most(128, torch.zeros(1, 8, dtype=torch.long))  # 8 ids cannot name 96 experts
    assert calls == []


def test_the_same_answer_as_the_extension():
    g = torch.Generator().manual_seed(0)
    for experts in (4, 8, 60, 128):
        for tokens in (1, 2, 8, 40, 200):
            ids = torch.randint(-1, experts, (tokens, 4), generator=g)
            assert routed_to_most(experts, ids) == bool(_C.routed_to_most(experts, ids)), (experts, tokens)
