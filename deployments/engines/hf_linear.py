"""Float32 linear layers on the CPU with weights packed once for oneDNN (deployments layer; ``HFEngine``'s
``pack_weights``).

A decode step multiplies a few rows by every weight matrix, and ``nn.Linear`` on the CPU hands oneDNN the plain
weight each call, which it lays out again for its kernels. Packing each weight once into oneDNN's layout
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplying with ``torch.ops.mkldnn._linear_pointwise`` skips
that: ``benchmarks/decode_step_profile.py`` and its ``--plain-weights`` print the step time each way. The module stays an
``nn.Linear`` (only its ``forward`` is replaced, on the instance), so peft wraps it for LoRA as before; LoRA's
matrices are not packed and adapters change nothing here. The plain weight is kept: peft and ``state_dict`` read
it, and the packed copy is only right while it does not change (the engine never changes base weights).
"""

from __future__ import annotations

import types

import torch
from torch import nn

BATCH_HINT = 32  # rows oneDNN lays the weights out for; any number of rows is multiplied correctly


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``pack_linears`` applies: float32 on the CPU with oneDNN (mkldnn) in this torch build."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype != torch.float32 or torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
        return nn.functional.linear(x, self.weight, self.bias)  # not what the packed copy is for
    out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self._packed_weight, self.bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


def pack_linears(model: nn.Module, batch_hint: int = BATCH_HINT) -> int:
    """Give every float32 ``nn.Linear`` of ``model`` a packed copy of its weight and the forward that uses it;
    returns how many were packed."""
    packed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu":
            with torch.no_grad():
                module._packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), batch_hint)
            module.forward = types.MethodType(_packed_forward, module)
            packed += 1
    return packed
