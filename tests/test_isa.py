"""ISA selection: isa_scope (this thread's calls only) beside the process-wide set_isa."""
import threading

import pytest

import torch_ktmoe


def test_isa_scope_is_per_thread_nests_and_restores():
    default = torch_ktmoe.active_isa()
    seen = {}
    with torch_ktmoe.isa_scope("generic"):
        assert torch_ktmoe.active_isa() == "generic"
        t = threading.Thread(target=lambda: seen.setdefault("other", torch_ktmoe.active_isa()))
        t.start()
        t.join()
        with torch_ktmoe.isa_scope(torch_ktmoe.available_isas()[-1]) as best:
            assert torch_ktmoe.active_isa() == best
        assert torch_ktmoe.active_isa() == "generic"
        with pytest.raises(ZeroDivisionError), torch_ktmoe.isa_scope("auto"):
            1 / 0
        assert torch_ktmoe.active_isa() == "generic"
    assert seen["other"] == default
    assert torch_ktmoe.active_isa() == default


def test_isa_scope_overrides_set_isa_on_its_thread_only():
    default = torch_ktmoe.active_isa()
    try:
        torch_ktmoe.set_isa("generic")
        with torch_ktmoe.isa_scope("auto"):
            assert torch_ktmoe.active_isa() == torch_ktmoe.available_isas()[-1]
        assert torch_ktmoe.active_isa() == "generic"
    finally:
        torch_ktmoe.set_isa(default)


def test_isa_scope_refuses_an_unknown_isa():
    with pytest.raises(RuntimeError, match="unknown ISA 'sse9'.*Available: generic"):
        with torch_ktmoe.isa_scope("sse9"):
            pass
