"""Framework integrations of :class:`torch_ktmoe.KTMoE`.

* :mod:`torch_ktmoe.integrations.transformers_experts` -- the module that takes the
  place of a Hugging Face transformers 5.x experts block, the ``"ktmoe"`` experts
  implementation, and the table of supported experts classes.

Nothing here is imported by ``import torch_ktmoe``; transformers is optional.
"""
