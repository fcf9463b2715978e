"""Overlap of KTMoEWrapper's CPU experts with work in the calling thread (sglang's GPU half).

sglang calls ``submit_forward``, runs the GPU experts, then ``sync_forward``. Here the
GPU work is a stand-in: ``--work-ms`` of busy Python in the calling thread, which
needs the GIL, so it only overlaps the experts if ``torch.ops.ktmoe.moe_forward``
releases it. Three cases, alternated in each round, medians and minima printed:

* ``cpu``: ``forward`` alone;
* ``serial``: ``forward`` then the work (the sum);
* ``overlapped``: submit, work, sync (should be close to max(cpu, work)).

    python -m benchmarks.host.bench_sglang_overlap [--threads 1] [--tokens 256] [--rounds 15]
"""
import argparse
import statistics
import tempfile
import time

import torch

from benchmarks.cli import add_shape_arguments
from torch_ktmoe.sglang import KTMoEWrapper


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_arguments(ap, experts=8, top_k=2, hidden=1024, intermediate=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    E, H, I, K, T = a.experts, a.hidden, a.intermediate, a.top_k, a.tokens
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as empty_checkpoint_dir:
        wr = KTMoEWrapper(0, E, K, H, I, 0, None, 1, empty_checkpoint_dir, T, method="BF16")
    wr.load_weights_from_tensors(torch.randn(E, I, H, generator=g) / H ** 0.5,
                                 torch.randn(E, I, H, generator=g) / H ** 0.5,
                                 torch.randn(E, H, I, generator=g) / I ** 0.5)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    w = torch.full((T, K), 1.0 / K)
    work = a.work_ms / 1e3

    def serial():
        wr.forward(x, ids, w)
        spin(work)

    def overlapped():
        wr.submit_forward(x, ids, w, 0)
        spin(work)
        wr.sync_forward(x, 0)

    cases = {"cpu": lambda: wr.forward(x, ids, w), "serial": serial, "overlapped": overlapped}
    for fn in cases.values():
        fn()  # warm
    times = {k: [] for k in cases}
    for _ in range(a.rounds):
        for k, fn in cases.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"E={E} top-{K} H={H} I={I} T={T}, {a.threads} thread(s), caller work {a.work_ms:.1f} ms, "
          f"{a.rounds} rounds alternated\n")
    print("| case | median ms | min ms |\n| --- | ---: | ---: |")
    for k, v in times.items():
        print(f"| {k} | {med[k]:.1f} | {min(v):.1f} |")
    ideal = max(med["cpu"], a.work_ms)
    print(f"\noverlapped / max(cpu, work) = {med['overlapped'] / ideal:.2f}; "
          f"overlapped / serial = {med['overlapped'] / med['serial']:.2f}")


if __name__ == "__main__":
    main()
