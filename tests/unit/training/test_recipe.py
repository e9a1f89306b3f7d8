"""Spec fields of the recipe that need no long run: step count, AMP, pruned models."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from maskops.checkpoints.model_file import load_model, read_checkpoint, save_checkpoint
from maskops.prune import prune_model
from maskops.spec.models import ExperimentSpec
from maskops.training import TrainingError, run_training
from maskops.training.rules import TAO_RULES, earlier
from maskops.training.train import resolve_total_steps
from maskops.training.trainer import AmpSettings

SpecFactory = Callable[..., ExperimentSpec]


def test_total_steps_from_epochs_divides_by_accumulation_not_by_processes(
    spec_factory: SpecFactory,
) -> None:
    """As TAO's train.py: num_examples_per_epoch is per GPU and every rank runs them all
    (2-rank runs: test_two_hosts_on_loopback_gather_through_the_c10d_rendezvous)."""
    assert resolve_total_steps(spec_factory(total_steps=7)) == 7
    epochs = spec_factory(num_epochs=3, num_examples_per_epoch=24, train_batch_size=2)
    assert resolve_total_steps(epochs) == 36
    # Only a run started by an earlier maskops on 2 ranks keeps dividing by them.
    assert resolve_total_steps(epochs, earlier(2.0)) == 18
    accumulating = spec_factory(
        num_epochs=3, num_examples_per_epoch=24, train_batch_size=2, accumulate_grad_steps=3
    )
    assert resolve_total_steps(accumulating) == 12
    with pytest.raises(TrainingError, match="total_steps"):
        resolve_total_steps(spec_factory(total_steps=0))


def test_amp_settings_per_device() -> None:
    cpu = AmpSettings.for_device(torch.device("cpu"), enabled=True, cpu_bf16_native=True)
    assert cpu.enabled and cpu.dtype == torch.bfloat16 and not cpu.needs_scaler
    slow_cpu = AmpSettings.for_device(torch.device("cpu"), enabled=True, cpu_bf16_native=False)
    assert not slow_cpu.enabled and "no native bf16" in slow_cpu.declined
    with cpu.autocast():
        out = torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 3))
    assert out.dtype == torch.bfloat16
    off = AmpSettings.for_device(torch.device("cpu"), enabled=False)
    with off.autocast():
        assert torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 3)).dtype == torch.float32


def test_use_amp_trains_on_cpu_with_fp32_weights(spec_factory: SpecFactory, tmp_path: Path) -> None:
    spec = spec_factory(use_amp=True, total_steps=1, data_config={"val_json_file": ""})
    result = run_training(spec, tmp_path, log_every=1, eval_fn=lambda model, step: {})
    weights = read_checkpoint(result.checkpoint)["model"]  # type: ignore[arg-type]
    assert all(v.dtype != torch.bfloat16 for v in weights.values())
    assert torch.isfinite(torch.tensor(result.metrics["Total loss"]))


def test_accumulation_consumes_micro_batches(spec_factory: SpecFactory, tmp_path: Path) -> None:
    spec = spec_factory(
        total_steps=1,
        accumulate_grad_steps=2,
        train_batch_size=1,
        data_config={"val_json_file": ""},
    )
    result = run_training(spec, tmp_path, log_every=1, eval_fn=lambda model, step: {})
    assert read_checkpoint(result.checkpoint)["data_position"] == 2  # type: ignore[arg-type]
    # Rerunning with another accumulation would silently change the data order: refused.
    more = spec.model_copy(update={"total_steps": 2, "accumulate_grad_steps": 1})
    with pytest.raises(TrainingError, match="accumulate_grad_steps"):
        run_training(more, tmp_path)


def test_pruned_model_path_trains_the_pruned_architecture_with_the_regularisers(
    spec_factory: SpecFactory,
    tiny_checkpoint: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    loaded = load_model(tiny_checkpoint)
    prune_model(
        loaded.model,
        example_inputs=torch.rand(1, 3, 128, 128),
        threshold=0.9,
        granularity=8,
        min_filters=8,
    )
    pruned_shapes = {k: tuple(v.shape) for k, v in loaded.model.state_dict().items()}
    pruned = save_checkpoint(
        tmp_path / "pruned.pth",
        model=loaded.model,
        spec=loaded.spec,
        label_map=loaded.label_map,
        step=0,
    )
    spec = spec_factory(
        pruned_model_path=str(pruned),
        total_steps=1,
        l1_weight_decay=1e-4,
        l2_weight_decay=1e-4,
        data_config={"val_json_file": ""},
    )
    with caplog.at_level(logging.INFO, logger="maskops.train"):
        result = run_training(spec, tmp_path / "run", log_every=1, eval_fn=lambda m, s: {})
    trained = read_checkpoint(result.checkpoint)["model"]  # type: ignore[arg-type]
    assert {k: tuple(v.shape) for k, v in trained.items()} == pruned_shapes
    unpruned = read_checkpoint(tiny_checkpoint)["model"]
    assert sum(v.numel() for v in trained.values()) < sum(v.numel() for v in unpruned.values())
    # As TAO, which adds both regularisers to the loss whatever pruned_model_path says.
    assert "turned off" not in caplog.text
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["L2 loss"] > 0 and record["L1 loss"] > 0


def test_a_checkpoint_of_an_earlier_maskops_resumes_with_the_rules_it_started_with(
    spec_factory: SpecFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before following TAO, maskops multiplied the rates by the number of ranks, divided
    num_epochs' steps by it and stored only that ``lr_scale``: such a run ends as it would
    have, and its new checkpoints say so."""
    spec = spec_factory(
        num_epochs=2,
        num_examples_per_epoch=4,
        warmup_steps=0,
        learning_rate_steps=[2],
        learning_rate_decay_levels=[0.5],
        logging_frequency=1,
        data_config={"val_json_file": ""},
    )
    first = run_training(
        spec.model_copy(update={"num_epochs": 0, "total_steps": 1}),
        tmp_path,
        eval_fn=lambda m, s: {},
    )
    state = read_checkpoint(first.checkpoint)  # type: ignore[arg-type]
    assert state["scheduler"]["rules"] == TAO_RULES.to_state()
    state["scheduler"] = {"lr_scale": 2.0, "step": 1}  # as an earlier 2-rank run wrote it
    torch.save(state, first.checkpoint)  # type: ignore[arg-type]

    with caplog.at_level(logging.WARNING, logger="maskops.train"):
        resumed = run_training(spec, tmp_path, eval_fn=lambda m, s: {})
    assert "written by an earlier maskops" in caplog.text and "learning rates x2" in caplog.text
    # TAO's rules would train ceil(2 * 4 / 2) = 4 steps at 0.004; it started with 4 / 2
    # steps at 2 x 0.004.
    assert resumed.step == 2
    rates = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rates if "learning rate" in r and r["step"] == 2]
    assert [r["learning rate"] for r in steps] == pytest.approx([0.008])
    latest = read_checkpoint(resumed.checkpoint)  # type: ignore[arg-type]
    assert latest["scheduler"]["rules"] == earlier(2.0).to_state()

    # Rules this version does not know: refused in one line, not guessed.
    latest["scheduler"]["rules"]["bias_lr_factor"] = 2.0
    torch.save(latest, resumed.checkpoint)  # type: ignore[arg-type]
    more = spec.model_copy(update={"num_epochs": 0, "total_steps": 3})
    with pytest.raises(TrainingError, match=r"cannot resume from .*\['bias_lr_factor'\]"):
        run_training(more, tmp_path, eval_fn=lambda m, s: {})
