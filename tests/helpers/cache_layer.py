"""A small KTMoE layer with a cache directory, and how the cache tests drive it."""
import torch

from torch_ktmoe import KTMoE
from tests.helpers import random_experts, random_routing

E, H, I, K = 4, 64, 96, 2
FILE = "layer0000.part0.ktmoe"


def make(directory, fmt="int8", **kwargs):
    kwargs.setdefault("numa_parts", 1)
    return KTMoE(E, K, H, I, weight_format=fmt, mmap_experts_dir=directory, **kwargs)


def run(m, seed=0):
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(seed))
    ids, w = random_routing(6, E, K, seed=seed)
    return m(x, ids, w)


def loaded(directory, seed=0, **kwargs):
    m = make(directory, **kwargs)
    m.load_weights(*random_experts(E, H, I, seed=seed))
    return m


def reason(m):
    (event,) = m.cache_events
    return event["reason"]
