"""Command line: ``python -m torch_ktmoe info|demo``."""
import argparse
import sys


def cmd_info(args) -> int:
    import torch

    import torch_ktmoe
    from torch_ktmoe import _C

    print(f"torch_ktmoe {torch_ktmoe.__version__}")
    print(f"torch       {torch.__version__}")
    print(f"ISA         {torch_ktmoe.active_isa()} (auto would pick {_C.default_isa()}; "
          f"available: {', '.join(torch_ktmoe.available_isas())}; force with KTMOE_ISA)")
    print(f"threads     {torch.get_num_threads()} (torch.set_num_threads / OMP_NUM_THREADS)")
    print(f"NUMA nodes  {_C.numa_node_count()}")
    return 0


def cmd_demo(args) -> int:
    from torch_ktmoe.demo import run_demo

    return run_demo(args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_ktmoe", description="torch_ktmoe command line")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, torch, ISA chosen and available, threads").set_defaults(func=cmd_info)
    demo = sub.add_parser("demo", help="patch a Qwen3-MoE-shaped model and generate, anonymous vs file-backed")
    try:
        from torch_ktmoe.demo import add_demo_arguments
        add_demo_arguments(demo)
    except ImportError:
        pass
    demo.set_defaults(func=cmd_demo)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
