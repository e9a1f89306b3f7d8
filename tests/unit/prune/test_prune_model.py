"""prune_model on real (random-weight) Mask R-CNNs: TAO's options and structural soundness."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from maskops.prune import PruneError, prune_model
from maskops.prune.importance import filter_norms
from tests.unit.prune.small import IMAGE_SIZE, make_model, training_batch

EXAMPLE = torch.zeros(1, 3, *IMAGE_SIZE)


def conv(model: nn.Module, name: str) -> nn.Conv2d:
    module = model.get_submodule(name)
    assert isinstance(module, nn.Conv2d)
    return module


@torch.no_grad()
def scale_filters(model: nn.Module, name: str, filters: range | list[int], factor: float) -> None:
    conv(model, name).weight[list(filters)] *= factor


def prunable_convs(model: nn.Module) -> dict[str, nn.Conv2d]:
    return {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, nn.Conv2d) and n.startswith(("backbone.", "rpn.head.conv."))
    }


def test_threshold_zero_prunes_nothing() -> None:
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = prune_model(model, example_inputs=EXAMPLE, threshold=0.0)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert report.params_before == report.params_after
    assert report.macs_before == report.macs_after
    assert {g.status for g in report.groups} == {"kept"}
    assert not any(layer.changed for layer in report.layers)


@pytest.mark.parametrize(("min_filters", "granularity"), [(16, 8), (12, 8), (8, 8), (5, 1)])
def test_threshold_one_prunes_every_group_to_the_minimum(
    min_filters: int, granularity: int
) -> None:
    model = make_model()
    report = prune_model(
        model,
        example_inputs=EXAMPLE,
        threshold=1.0,
        min_filters=min_filters,
        granularity=granularity,
    )
    minimum = math.ceil(min_filters / granularity) * granularity
    assert report.groups, "no group found"
    for group in report.groups:
        assert group.status == "pruned", group
        assert group.channels_after == minimum
    # Every prunable conv (backbone, FPN, RPN head conv) is now at the minimum width.
    assert {m.out_channels for m in prunable_convs(model).values()} == {minimum}
    assert report.params_after < report.params_before / 4
    assert report.macs_after < report.macs_before / 10
    assert report.roi_macs_after < report.roi_macs_before


def test_granularity_rounds_the_kept_count_up() -> None:
    name = "backbone.body.layer2.0.conv1"  # a group of its own (128 filters)
    weak = range(0, 100, 2)  # 50 filters whose norm drops to 5% of the others
    base = make_model()
    scale_filters(base, name, weak, 0.05)
    original = conv(base, name).weight.detach().clone()
    for granularity, expected in [(1, 78), (16, 80), (32, 96)]:
        model = make_model()
        scale_filters(model, name, weak, 0.05)
        report = prune_model(
            model, example_inputs=EXAMPLE, threshold=0.5, granularity=granularity, min_filters=1
        )
        pruned = conv(model, name)
        assert pruned.out_channels == expected, granularity
        # The strong filters all survive, in order; the rest are the strongest weak ones.
        strong = [i for i in range(128) if i not in weak]
        survivors = pruned.weight.detach()
        kept_strong = [
            row for row in survivors if any(torch.equal(row, original[i]) for i in strong)
        ]
        assert len(kept_strong) == len(strong)
        # Random initial filters all score far above 0.5: nothing else is touched.
        others = [g for g in report.groups if name not in g.members]
        assert {g.status for g in others} == {"kept"}


# Residual group of resnet10's last stage: layer4.0.conv2 and layer4.0.downsample.0 add up.
# Filters 0..99 of conv2 and 50..199 of the downsample are zeroed: 50..99 are zero in both.
RESIDUAL = ("backbone.body.layer4.0.conv2", "backbone.body.layer4.0.downsample.0")


@pytest.mark.parametrize(
    ("equalization", "threshold", "kept"),
    [
        ("union", 0.5, 512 - 50),  # a channel goes only if both members drop it
        ("intersection", 0.5, 512 - 200),  # a channel goes if either member drops it
        ("arithmetic_mean", 0.4, 512 - 50),  # (1 + 0) / 2 survives 0.4
        ("arithmetic_mean", 0.6, 512 - 200),  # ...but not 0.6
        ("geometric_mean", 0.4, 512 - 200),  # sqrt(x * 0) = 0
    ],
)
def test_equalization_criteria_on_a_residual_group(
    equalization: str, threshold: float, kept: int
) -> None:
    model = make_model()
    with torch.no_grad():  # unit-norm filters: every normalised score is exactly 1 or 0
        for name in RESIDUAL:
            weight = conv(model, name).weight
            weight /= filter_norms(weight).view(-1, 1, 1, 1)
    scale_filters(model, RESIDUAL[0], range(100), 0.0)
    scale_filters(model, RESIDUAL[1], range(50, 200), 0.0)
    report = prune_model(
        model,
        example_inputs=EXAMPLE,
        equalization=equalization,  # type: ignore[arg-type]
        threshold=threshold,
        granularity=1,
        min_filters=1,
    )
    group = next(g for g in report.groups if set(RESIDUAL) <= set(g.members))
    assert group.channels_after == kept
    for name in RESIDUAL:
        assert conv(model, name).out_channels == kept
    # Consumers of the stage's output follow: the FPN lateral conv of C5.
    assert conv(model, "backbone.fpn.inner_blocks.3.0").in_channels == kept


def test_l2_normaliser_scores_wide_layers_lower() -> None:
    # With L2 normalisation, C equal-ish filters each score about 1/sqrt(C): 512 filters
    # score ~0.044, under 0.1, while 64-filter groups score ~0.125 and survive.
    by_max, by_l2 = make_model(), make_model()
    prune_model(by_max, example_inputs=EXAMPLE, norm="max", threshold=0.1)
    prune_model(by_l2, example_inputs=EXAMPLE, norm="L2", threshold=0.1)
    assert conv(by_max, "backbone.body.layer4.0.conv1").out_channels == 512
    assert conv(by_l2, "backbone.body.layer4.0.conv1").out_channels == 16
    assert conv(by_l2, "backbone.body.layer1.0.conv1").out_channels == 64


def test_excluded_layers_and_everything_coupled_to_them_are_unchanged() -> None:
    model = make_model()
    excluded = ["backbone.body.layer2.0.conv1", "backbone.body.layer3"]
    protected = [n for n in prunable_convs(model) if n == excluded[0] or n.startswith(excluded[1])]
    before = {n: conv(model, n).weight.detach().clone() for n in protected}
    report = prune_model(model, example_inputs=EXAMPLE, threshold=1.0, excluded_layers=excluded)
    for name, weight in before.items():
        assert torch.equal(conv(model, name).weight, weight), name
    statuses = {g.members: g.status for g in report.groups}
    # layer3's input is layer2's residual output: that group is frozen too.
    layer2_group = next(m for m in statuses if "backbone.body.layer2.0.conv2" in m)
    assert statuses[layer2_group] == "excluded"
    # Layers coupled to nothing excluded are still pruned.
    assert conv(model, "backbone.body.layer1.0.conv1").out_channels == 16
    assert conv(model, "backbone.body.layer4.0.conv1").out_channels == 16


def test_unknown_excluded_layer_is_a_clear_error() -> None:
    with pytest.raises(PruneError, match=r"excluded layer 'backbone\.body\.layer9'"):
        prune_model(make_model(), example_inputs=EXAMPLE, excluded_layers=["backbone.body.layer9"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("norm", "L1", "norm must be one of max, L2"),
        ("equalization", "mean", "equalization must be one of"),
        ("granularity", 0, "granularity must be >= 1"),
        ("threshold", 1.5, r"threshold must be within \[0, 1\]"),
        ("min_filters", 0, "min_filters must be >= 1"),
    ],
)
def test_bad_options_are_rejected(option: str, value: object, message: str) -> None:
    with pytest.raises(PruneError, match=message):
        prune_model(make_model(), example_inputs=EXAMPLE, **{option: value})  # type: ignore[arg-type]


def _randomise_importance(model: nn.Module) -> None:
    """Give every filter a random norm so that groups keep different, uneven counts."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in prunable_convs(model).values():
            module.weight *= torch.rand(module.out_channels, 1, 1, 1, generator=generator)


@pytest.mark.parametrize("nlayers", [10, 18])
def test_pruned_model_trains_and_predicts_at_several_image_sizes(nlayers: int) -> None:
    model = make_model(nlayers=nlayers)
    _randomise_importance(model)
    report = prune_model(model, example_inputs=EXAMPLE, threshold=0.5, granularity=8)
    widths = {g.channels_after for g in report.groups if g.status == "pruned"}
    assert len(widths) > 2, "expected uneven pruning across groups"
    # The FPN width changed, and every head reading it followed.
    fpn_width = conv(model, "backbone.fpn.layer_blocks.0.0").out_channels
    assert fpn_width < 256
    assert conv(model, "rpn.head.conv.0.0").in_channels == fpn_width
    assert conv(model, "roi_heads.mask_head.0.0").in_channels == fpn_width
    fc6 = model.get_submodule("roi_heads.box_head.fc6")
    assert isinstance(fc6, nn.Linear) and fc6.in_features == fpn_width * 7 * 7

    for height, width in [(128, 128), (128, 192), (192, 160)]:
        model.train()
        model.zero_grad()
        images, targets = training_batch(height, width)
        losses = model(images, targets)
        total = sum(losses.values())
        assert torch.isfinite(total)
        total.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None for g in grads)
        model.eval()
        with torch.no_grad():
            (output,) = model(images)
        assert output["boxes"].shape[1] == 4
        assert output["masks"].shape[0] == output["boxes"].shape[0]


def test_frozen_blocks_and_frozen_batch_norm_are_pruned_consistently() -> None:
    model = make_model(freeze_bn=True, freeze_blocks=[0, 1])
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen, "freeze_blocks should freeze the stem and layer1"
    prune_model(model, example_inputs=EXAMPLE, threshold=1.0)
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == frozen
    state = model.state_dict()
    assert state["backbone.body.bn1.weight"].shape[0] == 16  # a FrozenBatchNorm2d buffer
    assert conv(model, "backbone.body.conv1").out_channels == 16
    assert state["backbone.body.layer1.0.bn2.running_var"].shape[0] == 16
    model.train()
    images, targets = training_batch(128, 128)
    sum(model(images, targets).values()).backward()
