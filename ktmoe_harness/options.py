"""The command-line flags of a model run, shared by the demo and the Hugging Face benchmarks.

``add_model_arguments``: which model (a local checkpoint, or the shape of a random one) and
where its files go. ``add_run_arguments``: how it runs (weight format, threads, tokens), plus
the two hidden flags by which a parent hands a child process its mode and result file
(ktmoe_harness.child).
"""
import argparse
import dataclasses

from torch_ktmoe.ops import WEIGHT_FORMATS


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A random Qwen3-MoE model's size; the defaults pack ~768 MiB of bf16 experts."""
    layers: int = 8
    hidden: int = 1024
    intermediate: int = 512  # per expert
    experts: int = 32
    top_k: int = 4
    vocab: int = 8192


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """--checkpoint, or the random model's shape (ModelShape's fields); --mmap-dir for the work files."""
    d = ModelShape()
    ap.add_argument("--checkpoint", help="a local transformers MoE checkpoint directory (default: build one)")
    ap.add_argument("--layers", type=int, default=d.layers)
    ap.add_argument("--hidden", type=int, default=d.hidden)
    ap.add_argument("--intermediate", type=int, default=d.intermediate, help="per-expert intermediate size")
    ap.add_argument("--experts", type=int, default=d.experts)
    ap.add_argument("--top-k", type=int, default=d.top_k)
    ap.add_argument("--vocab", type=int, default=d.vocab)
    ap.add_argument("--mmap-dir", default=None,
                    help="parent of the temporary work directory (default: /var/tmp, which is disk, not tmpfs)")


def add_run_arguments(ap: argparse.ArgumentParser, modes=None) -> None:
    """--format, --threads, --prompt-tokens, --tokens; hidden: --mode (one of `modes`) and --result of a child."""
    ap.add_argument("--format", default="bf16", choices=WEIGHT_FORMATS, help="packed weight format")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32, help="new tokens to generate")
    ap.add_argument("--mode", choices=modes, help=argparse.SUPPRESS)  # child process: which run of the parent's
    ap.add_argument("--result", help=argparse.SUPPRESS)  # child process: where its JSON result goes
