"""Reshape a built model to a (pruned) state dict's tensor shapes.

Structured pruning removes whole channels, so a pruned checkpoint has the same module tree
and parameter names as the model the spec builds, only with smaller tensors. Rebuilding
the pruned architecture is therefore: build from the spec, then replace every layer whose
tensor shapes differ with a layer of the stored shapes (same stride, padding, dilation,
groups, bias). Every layer's forward is shape-driven, so the result runs as is.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torchvision.ops.misc import FrozenBatchNorm2d


def _shape(state_dict: Mapping[str, Tensor], key: str) -> tuple[int, ...] | None:
    tensor = state_dict.get(key)
    return None if tensor is None else tuple(tensor.shape)


def _resized(module: nn.Module, prefix: str, state_dict: Mapping[str, Tensor]) -> nn.Module | None:
    """A replacement for ``module`` shaped like ``state_dict[prefix + ...]``, or None if it fits."""
    weight_shape = _shape(state_dict, prefix + "weight")
    if isinstance(module, nn.Conv2d | nn.ConvTranspose2d):
        if weight_shape is None or weight_shape == tuple(module.weight.shape):
            return None
        groups = module.groups
        if isinstance(module, nn.ConvTranspose2d):
            # ConvTranspose2d weights are [in, out / groups, kh, kw].
            in_ch, out_ch = weight_shape[0], weight_shape[1] * groups
        else:
            out_ch, in_ch = weight_shape[0], weight_shape[1] * groups
        cls = type(module)
        new = cls(
            in_ch,
            out_ch,
            module.kernel_size,  # type: ignore[arg-type]
            stride=module.stride,  # type: ignore[arg-type]
            padding=module.padding,  # type: ignore[arg-type]
            dilation=module.dilation,  # type: ignore[arg-type]
            groups=groups,
            bias=module.bias is not None,
            padding_mode=module.padding_mode,
        )
        return new.to(device=module.weight.device, dtype=module.weight.dtype)
    if isinstance(module, nn.Linear):
        if weight_shape is None or weight_shape == tuple(module.weight.shape):
            return None
        return nn.Linear(weight_shape[1], weight_shape[0], bias=module.bias is not None).to(
            device=module.weight.device, dtype=module.weight.dtype
        )
    if isinstance(module, nn.BatchNorm2d | FrozenBatchNorm2d):
        shape = weight_shape or _shape(state_dict, prefix + "running_mean")
        # FrozenBatchNorm2d has no num_features attribute; its buffers carry the size.
        current = module.weight.shape[0] if module.weight is not None else module.num_features
        if shape is None or shape[0] == current:
            return None
        if isinstance(module, FrozenBatchNorm2d):
            return FrozenBatchNorm2d(shape[0], eps=module.eps).to(module.running_mean.device)
        bn = nn.BatchNorm2d(
            shape[0],
            eps=module.eps,
            momentum=module.momentum,
            affine=module.affine,
            track_running_stats=module.track_running_stats,
        )
        if module.weight is not None:
            bn = bn.to(device=module.weight.device)
            bn.weight.requires_grad_(module.weight.requires_grad)
            bn.bias.requires_grad_(module.bias.requires_grad)
        return bn
    return None


@torch.no_grad()
def resize_to_state_dict(model: nn.Module, state_dict: Mapping[str, Tensor]) -> list[str]:
    """Replace, in place, every Conv2d/ConvTranspose2d/Linear/BatchNorm2d/FrozenBatchNorm2d
    of ``model`` whose tensor shapes differ from ``state_dict``'s.

    The replacements are freshly initialised; load ``state_dict`` afterwards. Layers absent
    from ``state_dict`` are left alone. Frozen layers (``requires_grad=False``) stay frozen.

    Returns:
        The qualified names of the replaced modules.
    """
    replaced: list[str] = []
    for name, module in list(model.named_modules()):
        prefix = f"{name}." if name else ""
        new = _resized(module, prefix, state_dict)
        if new is None:
            continue
        old_params = dict(module.named_parameters(recurse=False))
        for pname, param in new.named_parameters(recurse=False):
            if pname in old_params:
                param.requires_grad_(old_params[pname].requires_grad)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
        replaced.append(name)
    return replaced
