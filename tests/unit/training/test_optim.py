from __future__ import annotations

import torch
from torch import nn

from maskops.training.optim import (
    build_optimizer,
    l1_penalty,
    l2_loss_value,
    regularized_parameters,
)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))


def test_l2_decays_kernels_only() -> None:
    model = _model()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = build_optimizer(model, lr=1.0, momentum=0.0, l2_weight_decay=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    for name, value in before.items():
        if value.ndim > 1:  # conv and linear kernels shrink by lr * wd
            torch.testing.assert_close(after[name].detach(), value * 0.9)
        else:  # biases and batch-norm scale/shift do not decay
            assert torch.equal(after[name].detach(), value), name


def test_frozen_parameters_are_not_optimised() -> None:
    model = _model()
    model[0].weight.requires_grad_(False)
    opt = build_optimizer(model, lr=0.1, momentum=0.9, l2_weight_decay=0.1)
    optimised = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model[0].weight) not in optimised
    assert id(model[0].weight) not in {id(p) for p in regularized_parameters(model)}


def test_l1_penalty_value_and_gradient() -> None:
    model = _model()
    params = regularized_parameters(model)
    penalty = l1_penalty(params, 0.5)
    expected = 0.5 * sum(float(p.abs().sum()) for p in params)
    assert abs(float(penalty) - expected) < 1e-3
    penalty.backward()
    for p in params:
        assert p.grad is not None
        torch.testing.assert_close(p.grad, 0.5 * torch.sign(p.detach()))


def test_l2_loss_is_tao_half_sum_of_squares() -> None:
    model = _model()
    params = regularized_parameters(model)
    expected = 1e-4 * sum(float(p.pow(2).sum()) for p in params) / 2
    assert abs(l2_loss_value(params, 1e-4) - expected) < 1e-9


def test_momentum_reaches_the_optimizer() -> None:
    opt = build_optimizer(_model(), lr=0.1, momentum=0.7, l2_weight_decay=0.0)
    assert {g["momentum"] for g in opt.param_groups} == {0.7}
