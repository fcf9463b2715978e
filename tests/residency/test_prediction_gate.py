"""PredictionGate (torch_ktmoe.residency.prediction_gate): a layer whose predictions' recall over the last forwards
makes reading them a loss stops having them read, still probes one forward in a few, and is read again once the
recall recovers; the switches are counted in the residency figures; outputs never change."""
import pytest
import torch
from torch import nn

import torch_ktmoe
from tests.helpers import random_experts
from torch_ktmoe import KTMoE
from torch_ktmoe.residency import reads as expert_reads
from torch_ktmoe.residency.prediction_gate import OFF_BELOW, ON_FROM, PROBE_EVERY, WINDOW, PredictionGate
from torch_ktmoe.residency.predictor import NextLayerPredictor

E, K, H, I = 8, 2, 64, 32


def test_off_below_half_probes_and_back_on_from_the_margin():
    gate = PredictionGate()
    for _ in range(WINDOW - 1):
        gate.judge(0, 2)
    assert gate.reading  # not judged before a full window
    gate.judge(0, 2)
    assert not gate.reading and gate.counts["prediction_switched_off"] == 1
    asked = [gate.predicts_now() for _ in range(2 * PROBE_EVERY)]
    assert asked.count(True) == 2 and gate.counts["prediction_off_forwards"] == 2 * PROBE_EVERY - 2
    for _ in range(WINDOW):
        gate.judge(2, 2)
    assert gate.reading and gate.counts["prediction_switched_on"] == 1 and gate.predicts_now()


@pytest.mark.parametrize("recall", [OFF_BELOW - 0.05, OFF_BELOW + 0.05])
def test_a_recall_between_the_thresholds_keeps_the_state(recall):
    gate = PredictionGate()
    found = round(recall * 20)
    for _ in range(WINDOW):
        gate.judge(found, 20)
    assert gate.reading == (found / 20 >= OFF_BELOW)
    reading = gate.reading
    for _ in range(WINDOW):
        gate.judge(round((OFF_BELOW + ON_FROM) / 2 * 20), 20)  # between: no switch either way
    assert gate.reading == reading


class Router(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = nn.Parameter(weight)


def test_a_predictor_whose_guesses_miss_stops_reading_and_counts_it(monkeypatch):
    reads = []
    monkeypatch.setattr(expert_reads, "read_ahead_experts", lambda w13, w2, ids: reads.append(ids))
    target = KTMoE(E, K, H, I, numa_parts=1, warm="none", next_layer_prefetch=True)
    gate_up, down = random_experts(E, H, I)
    target.load_weights(gate_up, down)
    router = Router(torch.randn(E, H))
    predictor = NextLayerPredictor(router, target)
    x = torch.randn(1, H)
    predicted = (x @ router.weight.T).topk(K, -1).indices
    missed = torch.tensor([[e for e in range(E) if e not in predicted[0].tolist()][:K]])  # routed: never predicted
    outputs = []
    for _ in range(WINDOW + 3 * PROBE_EVERY):
        predictor(x)
        outputs.append(target(x, missed, torch.full((1, K), 0.5)))
    assert len(reads) == WINDOW  # read while on; after the window judged recall 0: off, probes read nothing
    s = target.residency_stats()
    assert s["prediction_switched_off"] == 1 and s["prediction_reading"] is False
    assert s["prediction_off_forwards"] == 3 * PROBE_EVERY - 3 and s["predicted_forwards"] == WINDOW + 3
    assert all(torch.equal(o, outputs[0]) for o in outputs)
    report = torch_ktmoe.residency_report(target)
    assert report["prediction_switched_off"] == 1 and report["prediction_off_forwards"] == 3 * PROBE_EVERY - 3
    for _ in range(WINDOW * PROBE_EVERY):  # the routing now follows the prediction: back on
        predictor(x)
        target(x, predicted, torch.full((1, K), 0.5))
    assert target.residency_stats()["prediction_switched_on"] == 1 and target.reads.gate.reading
