"""What every benchmark's command line shares: one spelling of a layer's shape, one result writer.

* ``add_shape_arguments(ap, ...)``: ``--experts --top-k --hidden --intermediate`` (the spelling of
  ktmoe_harness.options for a model too), read back as ``args.experts``, ``args.top_k``, ...;
* ``add_out_argument(ap, name)``: ``--out`` (default benchmarks/results/NAME.json), and
  ``write_result(path, data)``: ``data`` as indented JSON there (its folder made), the path printed.
"""
import json
import os


def add_shape_arguments(ap, experts=128, top_k=8, hidden=2048, intermediate=768) -> None:
    """The layer's shape flags; the defaults are the reference shape (Qwen3-30B-A3B's layer)."""
    ap.add_argument("--experts", type=int, default=experts, help="experts in the layer (E)")
    ap.add_argument("--top-k", type=int, default=top_k, help="experts per token (k)")
    ap.add_argument("--hidden", type=int, default=hidden, help="hidden size (H)")
    ap.add_argument("--intermediate", type=int, default=intermediate, help="per-expert intermediate size (I)")


def add_out_argument(ap, name: str) -> None:
    ap.add_argument("--out", default=os.path.join("benchmarks", "results", f"{name}.json"),
                    help="where the results go, as JSON (default: %(default)s)")


def write_result(path: str, data) -> str:
    """Writes `data` as indented JSON to `path` (making its folder); prints and returns the path."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"results: {path}")
    return path
