"""Decode beside busy processes: the reference layer, the demo model and llama.cpp's layer on shared cores.

Question (issue 54): when other processes run on the model's cores (a co-tenant, a build, sglang's own
scheduler and tokenizer), does decode slow down in proportion (the fair share of 2 cores among 2 + 2 busy
processes is 0.5x), or collapse?

Subjects, each loaded once in its own process (benchmarks/host/cotenant_worker.py) and kept for the run:

* ``layer-anon`` / ``layer-file``: the reference layer (E=128, top-8, H=2048, I=768, bf16) at T=1,
  anonymous or file-backed experts; a run is the mean ms of ``--layer-reps`` forwards;
* ``demo-anon`` / ``demo-file``: ``python -m torch_ktmoe demo``'s random Qwen3-MoE (8 layers, 768 MiB of
  bf16 experts); a run is the decode tok/s of ``--demo-tokens`` greedy tokens;
* ``llama``: llama.cpp's layer harness (benchmarks/baselines/llama_layer.py, ``KTMOE_LLAMA_PEER``), bf16,
  the same shape and thread count.

Conditions: quiet, and beside 1 and 2 busy processes (``yes > /dev/null``) per core pair. Every round
visits every condition, and within a condition every subject of every variant, in alternating order.
A variant is a tree to import torch_ktmoe from plus environment, ``--variant NAME=PATH[,VAR=VALUE...]``
(default: this tree as ``after``); e.g. ``--variant before=/tmp/main-tree`` times main's code in the same
session. The table gives, per subject and condition, the worst and the median run, and the speed against
quiet paired by round (busy run / quiet run of the same round: 0.5x = half as fast), worst and median.

    python -m benchmarks.host.bench_cotenant --rounds 5 \\
        --variant before=/tmp/main-tree --variant after=. --variant after-passive=.,OMP_WAIT_POLICY=PASSIVE
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import ROOT

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cotenant_worker.py")
SUBJECTS = ("layer-anon", "layer-file", "demo-anon", "demo-file", "llama")


class Worker:
    """A cotenant_worker.py process for one subject of one variant."""

    def __init__(self, subject, tree, env, threads, checkpoint, work):
        kind, mode = subject.split("-")
        cmd = [sys.executable, WORKER, kind, "--threads", str(threads)]
        if kind == "demo":
            cmd += ["--checkpoint", checkpoint]
        if mode == "file":
            cmd += ["--experts-dir", tempfile.mkdtemp(prefix="experts-", dir=work)]
        full_env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), **env}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=full_env,
                                     stderr=subprocess.DEVNULL, cwd=work)
        self._reply("ready")

    def _reply(self, tag):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"co-tenant worker exited with {self.proc.wait()}")
            if line.startswith(tag):
                return line[len(tag):].strip()

    def run(self, n):
        self.proc.stdin.write(f"run {n}\n")
        self.proc.stdin.flush()
        return float(self._reply("result"))

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


class LlamaWorker:
    """llama.cpp's layer harness, bf16, the reference shape; a run is the mean ms of `n` forwards."""

    def __init__(self, threads):
        from benchmarks.baselines.llama_layer import GgmlMoeLayer

        self.layer, self.threads = GgmlMoeLayer("bf16", 128, 8, 2048, 768), threads

    def run(self, n):
        return statistics.fmean(self.layer.run(1, self.threads, n))

    def close(self):
        self.layer.close()


def busy(count):
    """`count` processes of ``yes > /dev/null``."""
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]


def parse_variant(text):
    name, _, rest = text.partition("=")
    tree, *pairs = rest.split(",")
    return name, tree or ROOT, dict(p.split("=", 1) for p in pairs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="NAME=TREE[,VAR=VALUE...] (repeatable)")
    ap.add_argument("--subjects", default=",".join(SUBJECTS))
    ap.add_argument("--busy", default="0,1,2", help="busy processes per core pair, one condition each")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--layer-reps", type=int, default=150)
    ap.add_argument("--demo-tokens", type=int, default=24)
    ap.add_argument("--mmap-dir", default="/var/tmp")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("after", ROOT, {})]
    subjects = args.subjects.split(",")
    conditions = [int(c) for c in args.busy.split(",")]
    pairs = max(1, (os.cpu_count() or 2) // 2)

    work = tempfile.mkdtemp(prefix="ktmoe-cotenant-", dir=args.mmap_dir)
    workers = {}
    try:
        checkpoint = None
        if any(s.startswith("demo") for s in subjects):
            from ktmoe_harness.checkpoint import build_checkpoint
            from ktmoe_harness.options import ModelShape

            checkpoint = os.path.join(work, "checkpoint")
            build_checkpoint(ModelShape(), checkpoint)
        for s in subjects:
            if s == "llama":
                workers[("llama", s)] = LlamaWorker(args.threads)
                continue
            for name, tree, env in variants:
                print(f"loading {s} ({name}) ...", file=sys.stderr, flush=True)
                workers[(name, s)] = Worker(s, tree, env, args.threads, checkpoint, work)
        results = {key: {c: [] for c in conditions} for key in workers}
        keys = list(workers)
        print(f"load average before: {os.getloadavg()}", flush=True)
        for r in range(args.rounds):
            for c in conditions:
                procs = busy(c * pairs)
                try:
                    time.sleep(0.5)
                    order = keys if (r + c) % 2 == 0 else keys[::-1]
                    for key in order:
                        n = args.demo_tokens if key[1].startswith("demo") else args.layer_reps
                        results[key][c].append(workers[key].run(n))
                finally:
                    for p in procs:
                        p.kill()
                        p.wait()
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
        print_table(results, conditions, pairs)
        return 0
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(work, ignore_errors=True)


def print_table(results, conditions, pairs):
    """Per (variant, subject) and condition: the worst and the median run in the subject's unit (ms or tok/s);
    then its speed against quiet, paired by round (the run beside busy processes over the quiet run of the
    same round, so that a slow drift of the host's own load cancels), worst / median over the rounds."""
    head = " | ".join(f"busy {c * pairs}: worst / median (x quiet, worst / median)" for c in conditions)
    print(f"\n| variant | subject | unit | {head} |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in conditions) + " |")
    for (name, subject), by_c in results.items():
        tok_s = subject.startswith("demo")
        quiet = by_c[conditions[0]]
        cells = []
        for c in conditions:
            v = by_c[c]
            worst = min(v) if tok_s else max(v)
            speed = [x / q if tok_s else q / x for x, q in zip(v, quiet)]
            cells.append(f"{worst:.3g} / {statistics.median(v):.3g} "
                         f"({min(speed):.2f}x / {statistics.median(speed):.2f}x)")
        print(f"| {name} | {subject} | {'tok/s' if tok_s else 'ms'} | " + " | ".join(cells) + " |")
    print("\nraw: " + repr({f"{k[0]}:{k[1]}": v for k, v in results.items()}))


if __name__ == "__main__":
    sys.exit(main())
