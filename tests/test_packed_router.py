"""hf.packed_router: a router whose forward is a reference router's computes its logits with ktmoe::linear.

Each reference router class against our forward on the same weight and inputs (logits within bf16 rounding,
the same experts, scores close); the families sharing the reference's source are packed, others refused by
name; loading a state dict packs the new weight again; state_dict keys do not change.
"""
import types

import pytest
import torch
import torch.nn as nn

from torch_ktmoe.hf.packed_router import REFERENCE_ROUTERS, pack_router, router_refusal

E, H, TOP_K = 32, 256, 4


def config(**extra):
    return types.SimpleNamespace(num_experts_per_tok=TOP_K, num_experts=E, num_local_experts=E, hidden_size=H,
                                 norm_topk_prob=extra.pop("norm_topk_prob", True), **extra)


def router_class(module, name):
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        pytest.skip(f"this transformers has no {module}.{name}")


def make_router(cls, **extra):
    router = cls(config(**extra)).to(torch.bfloat16)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, H, generator=torch.Generator().manual_seed(7)) * 0.05)
    return router


@pytest.mark.parametrize("key", list(REFERENCE_ROUTERS), ids=[n for _, n in REFERENCE_ROUTERS])
@pytest.mark.parametrize("norm", [True, False])
def test_packed_router_matches_its_reference(key, norm):
    cls = router_class(*key)
    ref, packed = make_router(cls, norm_topk_prob=norm), make_router(cls, norm_topk_prob=norm)
    assert router_refusal(packed) is None
    pack_router(packed)
    x = torch.randn(5, 1, H, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        (rl, rs, ri), (pl, ps, pi) = ref(x), packed(x)
    assert pl.shape == rl.shape == (5, E) and pl.dtype == rl.dtype == torch.bfloat16
    torch.testing.assert_close(pl.float(), rl.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(pi, ri)
    assert ps.dtype == rs.dtype
    torch.testing.assert_close(ps.float(), rs.float(), atol=1e-2, rtol=1e-2)
    assert list(packed.state_dict()) == ["weight"]


def test_families_sharing_the_source_are_packed_and_others_refused():
    olmoe = router_class("transformers.models.olmoe.modeling_olmoe", "OlmoeTopKRouter")
    assert router_refusal(make_router(olmoe)) is None
    mixtral = router_class("transformers.models.mixtral.modeling_mixtral", "MixtralTopKRouter")
    assert "none of the reference routers" in router_refusal(make_router(mixtral))
    with pytest.raises(ValueError, match="MixtralTopKRouter"):
        pack_router(make_router(mixtral))
    assert "no 2-D weight" in router_refusal(nn.ReLU())


def test_loading_a_state_dict_packs_the_new_weight():
    cls = router_class(*next(iter(REFERENCE_ROUTERS)))
    router, other = make_router(cls), make_router(cls)
    with torch.no_grad():
        other.weight.mul_(-1)
    pack_router(router)
    router.load_state_dict(other.state_dict())
    x = torch.randn(2, H).to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(router(x)[0].float(), other(x)[0].float(), atol=2e-2, rtol=2e-2)


def test_a_packed_router_survives_deepcopy_and_pickle():
    import copy
    import pickle

    cls = router_class(*next(iter(REFERENCE_ROUTERS)))
    router = make_router(cls)
    pack_router(router)
    x = torch.randn(3, H).to(torch.bfloat16)
    with torch.no_grad():
        ref = router(x)
        for clone in (copy.deepcopy(router), pickle.loads(pickle.dumps(router))):
            assert clone.forward.router is clone and clone.ktmoe_w_packed.data_ptr() != router.ktmoe_w_packed.data_ptr()
            out = clone(x)
            assert all(torch.equal(a, b) for a, b in zip(out, ref))
