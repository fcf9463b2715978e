"""Random MoE inputs: experts in the Hugging Face layout and top-k routings.

The one generator of both for tests (through tests/conftest.py) and benchmarks.
"""
import torch


def random_experts(experts, hidden, inter, dtype=torch.float32, seed=0):
    """gate_up [E, 2I, H], down [E, H, I] ~ N(0, 1/fan_in), drawn in fp32, then cast to `dtype`."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    down = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    return gate_up.to(dtype), down.to(dtype)


def random_routing(tokens, experts, top_k, seed=0, masked=0.0, generator=None):
    """(ids [T, k] int64, weights [T, k] fp32): distinct uniform experts per token, positive weights summing to 1.

    A fraction `masked` of the ids is then set to -1 (an expert that lives elsewhere). Draws
    from `generator` when given (a caller's shared stream), else from a new one seeded with `seed`.
    """
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    ids = torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :top_k].contiguous()
    w = torch.rand(tokens, top_k, generator=g) + 0.1
    if masked:
        ids[torch.rand(ids.shape, generator=g) < masked] = -1
    return ids, (w / w.sum(dim=1, keepdim=True)).contiguous()


def routings(tokens, experts, top_k, count, seed):
    """``count`` routings of `tokens` tokens from one stream seeded with `seed` (benchmarks cycle through them)."""
    g = torch.Generator().manual_seed(seed)
    return [random_routing(tokens, experts, top_k, generator=g) for _ in range(count)]
