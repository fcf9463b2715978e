"""Running a checkpoint the way the demo and the benchmarks time it.

``load_timed``: ``torch_ktmoe.hf.from_pretrained`` in bf16 and its wall time; ``seeded_prompt``:
the same random prompt in every process; ``generate``: greedy decoding with a KV cache;
``TokenClock``: a streamer that clocks each token as ``model.generate`` emits it.
"""
import time


class TokenClock:
    """A transformers streamer that records when generate emits the prompt and each new token
    (``times``, perf_counter seconds) and, if given, what ``probe()`` returns at that moment (``probes``)."""

    def __init__(self, probe=None):
        self.times = []
        self.probes = []
        self.probe = probe

    def put(self, value):
        self.times.append(time.perf_counter())
        if self.probe is not None:
            self.probes.append(self.probe())

    def end(self):
        pass


def load_timed(checkpoint, experts_dir, weight_format, progress=False, **options):
    """(model, seconds) of hf.from_pretrained(checkpoint) in bf16; experts_dir None: anonymous experts;
    ``options``: more keywords of hf.from_pretrained (e.g. ``pack_linears=False``)."""
    import torch

    from torch_ktmoe import hf

    t0 = time.perf_counter()
    model = hf.from_pretrained(checkpoint, mmap_experts_dir=experts_dir, weight_format=weight_format,
                               dtype=torch.bfloat16, progress=progress, **options)
    return model, time.perf_counter() - t0


def seeded_prompt(vocab_size, tokens, seed=1):
    """[1, tokens] token ids, uniform over the vocabulary, the same for a given seed."""
    import torch

    return torch.randint(0, vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))


def generate(model, prompt, new_tokens, progress=True):
    """Greedy decoding with a KV cache; returns (tokens, last logits, prefill s, decode s)."""
    import torch
    from tqdm.auto import tqdm

    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        prefill = time.perf_counter() - t0
        past, logits = out.cache, out.logits[:, -1]
        tokens = [int(logits.argmax(-1))]
        t0 = time.perf_counter()
        for _ in tqdm(range(new_tokens - 1), desc="  decoding", unit="tok", disable=not progress, leave=False):
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=past, use_cache=True)
            past, logits = out.cache, out.logits[:, -1]
            tokens.append(int(logits.argmax(-1)))
        decode = time.perf_counter() - t0
    return tokens, logits.float(), prefill, decode
