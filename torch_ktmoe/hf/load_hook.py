"""The one place torch_ktmoe touches a private transformers function: a hook around its weight loading."""

from __future__ import annotations

import contextlib
import threading

_LOAD_HOOK_LOCK = threading.Lock()


@contextlib.contextmanager
def before_and_after_weight_loading(before, after):
    """Run ``before(model)`` after transformers built the (meta) model and before it loads weights,
    and ``after(model, loading_info)`` right after; both through ``PreTrainedModel._load_pretrained_model``.

    The one place torch_ktmoe touches a private transformers function. Checked against
    transformers 5.19.0 (sglang 0.5.23's pin) and 5.24.0: a staticmethod
    ``(model, state_dict, checkpoint_files, load_config, expected_keys=None)`` returning
    ``(LoadStateDictInfo, dict)``. We found no public hook between building the model and
    loading its weights that can swap modules (``key_mapping`` and the weight conversions
    rename and transform tensors only). ``tests/test_hf.py::test_private_load_hook_still_fits``
    fails when that function changes shape; ``from_pretrained`` raises when it is not called.
    """
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["_load_pretrained_model"]
    fn = original.__func__ if isinstance(original, staticmethod) else original
    fired: list[bool] = []

    def hooked(model, *args, **kwargs):
        before(model)
        fired.append(True)
        out = fn(model, *args, **kwargs)
        info = out[0] if isinstance(out, tuple) else out
        after(model, info)
        return out

    with _LOAD_HOOK_LOCK:
        PreTrainedModel._load_pretrained_model = staticmethod(hooked)
        try:
            yield fired
        finally:
            PreTrainedModel._load_pretrained_model = original
