"""Expert biases (gpt-oss) split over a layer's NUMA parts and joined back: gate_up_bias [E, 2I] (gate columns, then up)
added before the activation, down_bias [E, H] to each expert's output; fp32 copies in anonymous memory."""
from typing import List, Optional, Tuple

import torch


def split(gate_up_bias: Optional[torch.Tensor], down_bias: Optional[torch.Tensor],
          bounds: List[int]) -> List[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]:
    """Per part p (intermediate columns ``[bounds[p], bounds[p+1])``): (its gate and up columns [E, 2 I_p], the down
    bias on part 0 only), fp32 contiguous copies; None where not given."""
    inter = bounds[-1]
    out = []
    with torch.no_grad():
        for p, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            b13 = None if gate_up_bias is None else torch.cat(
                [gate_up_bias[:, lo:hi], gate_up_bias[:, inter + lo:inter + hi]], 1).float().contiguous()
            b2 = None if down_bias is None or p > 0 else down_bias.detach().float().contiguous().clone()
            out.append((b13, b2))
    return out


def joined(b13: List[Optional[torch.Tensor]], b2: Optional[torch.Tensor]):
    """The parts' biases back as given: (gate_up_bias [E, 2I], down_bias [E, H]), or None each."""
    if b13[0] is None:
        return None, b2
    halves = [b.split(b.shape[1] // 2, 1) for b in b13]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 1), b2
