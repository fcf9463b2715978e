"""``python -m torch_ktmoe.sglang <sglang launch_server args> [--kt-mmap-experts-dir DIR]``.

The same flag without the argument-parser hook: takes ``--kt-mmap-experts-dir``
off the command line, exports it as ``$KTMOE_SGLANG_MMAP_EXPERTS_DIR`` (sglang's worker
processes inherit it), installs KTMoEWrapper into this process, then runs
``python -m sglang.launch_server`` with the remaining arguments, with ``OMP_WAIT_POLICY=PASSIVE`` exported
unless set (docs/threads.md). sglang's worker
processes install the wrapper through the plugin entry point, so the package
must be pip-installed (``pip install --no-build-isolation .``) either way.
"""
import os
import runpy
import sys

from .plugin import FLAG, install_wrapper
from .wrapper import MMAP_DIR_ENV


def split_flag(argv):
    """(argv without --kt-mmap-experts-dir, its value or None)."""
    rest, value, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a == FLAG:
            if i + 1 >= len(argv):
                raise SystemExit(f"{FLAG} needs a directory")
            value, i = argv[i + 1], i + 2
            continue
        if a.startswith(FLAG + "="):
            value = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return rest, value


def main(argv=None) -> None:
    rest, value = split_flag(sys.argv[1:] if argv is None else argv)
    if value:
        os.environ[MMAP_DIR_ENV] = os.path.abspath(value)
    # sglang's scheduler processes are spawned (new interpreters): their torch loads with this policy, so its
    # OpenMP threads sleep while they wait instead of spinning on cores shared with the tokenizer and the
    # detokenizer (docs/threads.md). A policy the user set wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    install_wrapper()
    sys.argv = ["sglang.launch_server", *rest]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
