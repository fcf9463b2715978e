"""Next-layer prefetch (torch_ktmoe.residency.predictor, torch_ktmoe.hf.next_layer): the predictor's ids and their recall on
cases with known routing, the read-ahead calls it makes, the wiring in patched transformers models (dense layers
skipped, the last MoE layer predicting nothing), outputs unchanged, off while the experts fit, compiled decode."""
import warnings

import pytest
import torch
from torch import nn

import torch_ktmoe
from tests.helpers import random_experts
from tests.helpers.hf_models import PROMPT, make_model
from torch_ktmoe import KTMoE, hf, memory
from torch_ktmoe.residency import reads as expert_reads
from torch_ktmoe.residency.predictor import NextLayerPredictor, NextLayerPrefetchWarning

E, K, H, I = 8, 2, 64, 32


def _layer(directory=None, idx=0, **kwargs):
    if directory is not None:
        directory.mkdir(exist_ok=True)
    gate_up, down = random_experts(E, H, I)
    layer = KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=idx, numa_parts=1, warm="none", **kwargs)
    layer.load_weights(gate_up, down)
    return layer


class Router(nn.Module):
    def __init__(self, weight, bias=None):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)


@pytest.fixture
def reads(monkeypatch):
    calls = []
    monkeypatch.setattr(expert_reads, "read_ahead_experts", lambda w13, w2, ids: calls.append((w13, w2, ids)))
    return calls


def test_recall_is_one_when_the_prediction_is_the_routing(reads):
    target = _layer(next_layer_prefetch=True)
    router = Router(torch.randn(E, H))
    predictor = NextLayerPredictor(router, target, k_prime=K)
    x = torch.randn(2, H)  # 4 of the 8 experts at most: read ahead expert by expert (not "most": streamed whole)
    predictor(x)
    routed = (x @ router.weight.T).topk(K, -1).indices  # what layer L+1's router chooses on the same state
    target(x, routed, torch.full((2, K), 0.5))
    s = target.residency_stats()
    assert s["recall"] == 1.0 and (s["predicted_forwards"], s["predicted_routed"], s["predicted_found"]) == (1, 4, 4)
    (w13, w2, ids), = reads  # one NUMA part: one call, with the union of the predicted experts
    assert w13 is target.w13_0 and w2 is target.w2_0 and torch.equal(ids, torch.unique(routed))


def test_recall_counts_each_routed_id_against_its_own_tokens_prediction(reads):
    target = _layer(next_layer_prefetch=True)
    router = Router(torch.randn(E, H), torch.randn(E))
    predictor = NextLayerPredictor(router, target)  # k' = k
    assert predictor.k_prime == K
    x = torch.randn(6, H)
    predictor(x)
    predicted = (x @ router.weight.T + router.bias).topk(K, -1).indices  # the router's bias counts
    routed = torch.randint(0, E, (6, K))
    routed[0, 1] = -1  # skipped: not counted
    target(x, routed, torch.full((6, K), 0.5))
    found = sum(int(routed[t, j] in predicted[t].tolist()) for t in range(6) for j in range(K) if routed[t, j] >= 0)
    s = target.residency_stats()
    assert (s["predicted_routed"], s["predicted_found"]) == (11, found) and s["recall"] == found / 11
    target(x, routed, torch.full((6, K), 0.5))  # no prediction pending: not counted again
    assert target.residency_stats()["predicted_forwards"] == 1


def test_a_prediction_for_other_tokens_is_dropped():
    target = _layer(next_layer_prefetch=True)
    NextLayerPredictor(Router(torch.randn(E, H)), target)(torch.randn(3, H))
    target(torch.randn(2, H), torch.zeros(2, K, dtype=torch.long), torch.ones(2, K))
    assert target.residency_stats() is None and target.next_layer_recall.pending is None  # nothing counted


def test_bias_corrected_sigmoid_choice_like_deepseek(reads):
    target = _layer(next_layer_prefetch=True)
    router = Router(torch.randn(E, H))
    router.register_buffer("e_score_correction_bias", torch.tensor([5.0] + [0.0] * (E - 1)))
    ids = NextLayerPredictor(router, target, k_prime=1).predict(torch.randn(4, H))
    assert ids.tolist() == [[0]] * 4  # the bias moves expert 0 first whatever the logits


def test_auto_by_default_follows_the_fit(tmp_path, reads, monkeypatch):
    router = Router(torch.randn(E, H))
    anonymous = _layer()
    NextLayerPredictor(router, anonymous)(torch.randn(1, H))
    assert not anonymous.next_layer_prefetching and not reads and anonymous.residency_stats() is None
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: True)
    fits = _layer(tmp_path / "fits")  # the default, "auto": a model that fits predicts nothing
    assert fits.next_layer_prefetch_mode == "auto" and not fits.next_layer_prefetching
    NextLayerPredictor(router, fits)(torch.randn(1, H))
    assert not reads
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: False)
    big = _layer(tmp_path / "big")
    assert big.next_layer_prefetching
    assert not _layer(tmp_path / "off", next_layer_prefetch=False).next_layer_prefetching
    NextLayerPredictor(router, big)(torch.randn(1, H))
    assert len(reads) == 1


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="next_layer_prefetch"):
        KTMoE(E, K, H, I, next_layer_prefetch="yes")
    target = _layer()
    with pytest.raises(ValueError, match="k_prime"):
        NextLayerPredictor(Router(torch.randn(E, H)), target, k_prime=0)
    with pytest.raises(ValueError, match="no 2-D weight"):
        NextLayerPredictor(nn.Module(), target)
    hashed = Router(torch.randn(E, H))
    hashed.register_buffer("tid2eid", torch.zeros(4, K, dtype=torch.long))
    with pytest.raises(ValueError, match="hash-routed"):
        NextLayerPredictor(hashed, target)
    model = make_model("qwen3_moe")
    hf.patch_model(model, pack_linears=False)
    with pytest.raises(ValueError, match="source"):
        hf.attach_next_layer_prefetch(model, source="attention")


def _predicted_layers(model):
    return [m for m in model.modules() if isinstance(m, KTMoE) and m.residency_stats() is not None]


def test_hf_wiring_skips_dense_layers_and_the_last_layer_predicts_nothing():
    model = make_model("deepseek_v3", num_hidden_layers=4)  # layer 0 dense, MoE layers 1, 2, 3
    report = hf.patch_model(model, next_layer_prefetch=True)
    assert report.layers_patched == [1, 2, 3]
    assert report.next_layer_predicted == [2, 3] and report.next_layer_left == {}
    with torch.no_grad():
        model(PROMPT)
    r = torch_ktmoe.residency_report(model)
    assert r["predicted_layers"] == 2 and set(r["per_layer"]) == {"model.layers.2.mlp.experts.ktmoe",
                                                                   "model.layers.3.mlp.experts.ktmoe"}
    assert all(s["predicted_routed"] == PROMPT.numel() * 2 for s in r["per_layer"].values())
    assert 0.0 <= r["recall"] <= 1.0
    assert r["recall"] == sum(s["recall"] for s in r["per_layer"].values()) / 2


def test_hf_wires_each_layers_one_next_link_by_module_order():
    """The link the predictor and a prefill's streaming follow: the next MoE layer's reads (the dense layer skipped),
    none after the last; each predictor targets its layer's link."""
    model = make_model("deepseek_v3", num_hidden_layers=4)  # layer 0 dense, MoE layers 1, 2, 3
    hf.patch_model(model, next_layer_prefetch=True)
    layers = [m for m in model.modules() if isinstance(m, KTMoE)]
    assert [m.layer_idx for m in layers] == [1, 2, 3]
    assert layers[0].reads.next is layers[1].reads and layers[1].reads.next is layers[2].reads
    assert layers[2].reads.next is None
    predictors = [h.predictor for m in model.modules() for h in m._forward_pre_hooks.values()
                  if hasattr(h, "predictor")]
    assert [p.target for p in predictors] == [layers[1].reads, layers[2].reads]


def test_hf_recall_is_one_when_the_residual_stream_does_not_change():
    """Attention and experts write nothing (o_proj, down_proj zero), the norms are equal: every layer's router
    sees the hidden state the previous layer's experts saw, so k' >= k predicts every routed expert."""
    model = make_model("qwen3_moe", num_hidden_layers=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj")):
                p.zero_()
    hf.patch_model(model, next_layer_prefetch=True, pack_linears=False)
    hf.attach_next_layer_prefetch(model, k_prime=2)
    with torch.no_grad():
        model(PROMPT)
    r = torch_ktmoe.residency_report(model)
    assert r["predicted_layers"] == 3 and r["recall"] == 1.0


@pytest.mark.parametrize("tokens", [1, PROMPT.shape[1]], ids=["decode", "prefill"])
def test_hf_outputs_are_the_same_with_and_without_it(reads, tokens):
    logits = {}
    for mode in (True, False):
        model = make_model("qwen3_moe", num_hidden_layers=3)
        report = hf.patch_model(model, next_layer_prefetch=mode)
        assert report.next_layer_predicted == ([1, 2] if mode else [])
        with torch.no_grad():
            logits[mode] = model(PROMPT[:, :tokens]).logits
    assert torch.equal(logits[True], logits[False])
    # one token: layers 0 and 1 read ahead k of layers 1 and 2's 8 experts, once each; the prompt's union is most
    # of them: a prefill, which reads nothing ahead (its layers stream their next layer whole instead)
    assert len(reads) == (2 if tokens == 1 else 0)


def test_a_prediction_naming_most_experts_reads_nothing_ahead(reads):
    target = _layer(next_layer_prefetch=True)
    predictor = NextLayerPredictor(Router(torch.randn(E, H)), target, k_prime=E)  # every expert for each token
    predictor(torch.randn(1, H))
    assert reads == [] and target.next_layer_recall.pending is not None  # recall is still counted


def test_hf_off_while_the_experts_fit(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: True)
    model = make_model("qwen3_moe", num_hidden_layers=3)
    report = hf.patch_model(model, mmap_experts_dir=tmp_path, next_layer_prefetch="auto")
    assert report.next_layer_predicted == [1, 2]  # wired ("auto"), but not running
    with torch.no_grad():
        model(PROMPT)
    r = torch_ktmoe.residency_report(model)
    assert not reads and r["predicted_layers"] == 0 and r["recall"] is None
    assert set(r["per_layer"]["model.layers.1.mlp.experts.ktmoe"]) >= {"recall", "hit_rate", "read_bytes_per_token"}


def test_hf_compiled_decode_with_it_forced_on():
    torch._dynamo.reset()
    model = make_model("qwen3_moe", num_hidden_layers=3)
    hf.patch_model(model, next_layer_prefetch=True)
    with torch.no_grad():
        eager = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4, do_sample=False)
    compiled = hf.compile_decode(model, max_cache_len=16, backend="aot_eager")
    with torch.no_grad():
        out = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4, do_sample=False)
    assert compiled.graphs == 1 and torch.equal(out, eager)
    torch._dynamo.reset()


def _warnings_once(fn, layers=1):
    """``fn()`` and its NextLayerPrefetchWarnings, one per predicting layer."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    ours = [str(s.message) for s in seen if issubclass(s.category, NextLayerPrefetchWarning)]
    assert len(ours) == layers, [str(s.message) for s in seen]
    return out, ours


def test_a_failing_read_ahead_switches_the_predictor_off_with_one_warning(monkeypatch):
    def fail(w13, w2, ids):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(expert_reads, "read_ahead_experts", fail)
    target = _layer(idx=4, next_layer_prefetch=True)
    predictor = NextLayerPredictor(Router(torch.randn(E, H)), target, layer_idx=3)
    _, (message,) = _warnings_once(lambda: [predictor(torch.randn(1, H)) for _ in range(3)])
    assert "layer 3" in message and "layer 4" in message and "Input/output error" in message
    assert predictor.off is not None and target.next_layer_recall.pending is None


def test_hf_a_failing_prediction_changes_no_output(monkeypatch):
    """A patched model's predictors whose reads fail: one warning per predicting layer over two forwards, the same
    logits as without prediction."""
    logits = {}
    for mode in (False, True):
        model = make_model("qwen3_moe", num_hidden_layers=3)
        hf.patch_model(model, next_layer_prefetch=mode)
        if mode:
            monkeypatch.setattr(expert_reads, "read_ahead_experts",
                                lambda w13, w2, ids: (_ for _ in ()).throw(FileNotFoundError(2, "gone")))
            logits[mode], messages = _warnings_once(lambda: [model(PROMPT[:, :1]).logits for _ in range(2)][-1], 2)
            assert "layer 0: next-layer prefetch of layer 1" in messages[0] and "FileNotFoundError" in messages[0]
        else:
            with torch.no_grad():
                logits[mode] = model(PROMPT[:, :1]).logits
    assert torch.equal(logits[True].detach(), logits[False])
