"""The sglang plugin: puts KTMoEWrapper into sglang's KTransformers path, adds --kt-mmap-experts-dir.

Registered as the entry point ``ktmoe`` of group ``sglang.srt.plugins``
(pyproject.toml). sglang calls :func:`register` from ``load_plugins()`` in every
process, before it parses the command line and before it builds the model:

* :func:`install_wrapper`: when ``kt_kernel`` is not installed, sets
  ``sglang.srt.layers.moe.kt_ep_wrapper.KTMoEWrapper`` to ours (and
  ``KTRANSFORMERS_AVAILABLE``). A real ``kt_kernel`` is never shadowed unless
  ``KTMOE_SGLANG=force``; either way the choice is logged.
* :func:`register_cli_flag`: hooks ``ServerArgs.add_cli_args`` to add
  ``--kt-mmap-experts-dir DIR`` and ``ServerArgs.from_cli_args`` to export it as
  ``$KTMOE_SGLANG_MMAP_EXPERTS_DIR``, which sglang's worker processes inherit and
  :class:`KTMoEWrapper` reads as its ``mmap_experts_dir`` default.
"""
from __future__ import annotations

import importlib.util
import logging
import os

from .wrapper import MMAP_DIR_ENV, KTMoEWrapper

log = logging.getLogger("torch_ktmoe.sglang")

FORCE_ENV = "KTMOE_SGLANG"  # "force": use torch_ktmoe even where kt_kernel is installed; "off": do nothing
FLAG = "--kt-mmap-experts-dir"


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group."""
    if os.environ.get(FORCE_ENV, "").lower() == "off":
        log.info("torch_ktmoe sglang plugin: %s=off, not installed", FORCE_ENV)
        return
    install_wrapper()
    register_cli_flag()


def install_wrapper() -> str:
    """Installs our KTMoEWrapper into sglang's kt_ep_wrapper unless kt_kernel is there.

    Returns which implementation sglang will use: ``"torch_ktmoe"`` or ``"kt_kernel"``.
    """
    from sglang.srt.layers.moe import kt_ep_wrapper

    force = os.environ.get(FORCE_ENV, "").lower() == "force"
    if importlib.util.find_spec("kt_kernel") is not None and not force:
        log.warning("sglang KTransformers experts: kt_kernel is installed and is used (torch_ktmoe's KTMoEWrapper "
                    "is not installed; set %s=force to use torch_ktmoe instead)", FORCE_ENV)
        return "kt_kernel"
    kt_ep_wrapper.KTMoEWrapper = KTMoEWrapper
    kt_ep_wrapper.KTRANSFORMERS_AVAILABLE = True
    log.warning("sglang KTransformers experts: using torch_ktmoe.sglang.KTMoEWrapper%s",
                " (forced over the installed kt_kernel)" if force else " (kt_kernel is not installed)")
    return "torch_ktmoe"


def _add_flag(result, parser, *args, **kwargs):
    if not any(FLAG in a.option_strings for a in parser._actions):
        parser.add_argument(FLAG, type=str, default=None, dest="kt_mmap_experts_dir",
                            help="[torch_ktmoe] keep the CPU experts' packed weights in files under this "
                                 "directory (reclaimable page cache, reused across restarts) instead of anonymous "
                                 f"memory; exported as ${MMAP_DIR_ENV}")
    return result


def _export_flag(cls, args, *rest, **kwargs):
    value = getattr(args, "kt_mmap_experts_dir", None)
    if value:
        os.environ[MMAP_DIR_ENV] = os.path.abspath(value)
        log.info("torch_ktmoe: %s %s -> $%s", FLAG, value, MMAP_DIR_ENV)
    return None


def register_cli_flag() -> None:
    """Hooks sglang's argument parsing (through its HookRegistry, applied by load_plugins)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", _add_flag, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", _export_flag, HookType.BEFORE)
