"""Checkpoints of a model with TopoEP layers, in the stock model's own layout.

``model.state_dict()`` of an attached model holds this rank's expert rows only (and TopoEP's
placement buffers). ``stock_state_dict(model)`` gathers every layer's experts from all ranks,
in the model's expert order, under the names the unwrapped model uses, so that
``stock_model.load_state_dict(sd)`` restores the model TopoEP was attached to.
"""
from __future__ import annotations

import torch.nn as nn

from .parallel import topoep_layers


def stock_state_dict(model: nn.Module) -> dict:
    """The state dict of ``model`` as it was before ``topoep.attach`` (a collective: every
    rank of each layer's group calls it, in the same order; every rank gets the whole dict)."""
    sd = model.state_dict()
    for name, layer in topoep_layers(model):
        prefix = f"{name}." if name else ""
        for key in [k for k in sd if k.startswith(prefix)]:
            del sd[key]
        parent = name.rpartition(".")[0]
        stock = (f"{parent}." if parent else "") + layer._export_prefix
        for key, tensor in layer.gather_experts().items():
            sd[stock + key] = tensor
    return sd
