"""The ranks of tests/unit/training/test_sharded_evaluation.py: ``run_ranks`` starts
``world_size`` processes (torch.multiprocessing, spawn) that form a gloo group, evaluate a
checkpoint sharded as a training run's evaluation does, and write what each saw to
``OUT_DIR/rank-R.json``."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from maskops.spec.models import ExperimentSpec
from maskops.training.distributed import EvalGroup, GroupTimeouts, RankInfo
from maskops.training.errors import EvaluationAbandoned
from maskops.training.periodic_evaluation import coco_eval_fn, sharded_coco_metrics
from maskops.training.trainer import AmpSettings

TIMEOUTS = GroupTimeouts(init_s=60.0, collective_s=60.0, evaluation_s=60.0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_ranks(world_size: int, spec: ExperimentSpec, checkpoint: Path, out_dir: Path) -> None:
    """Run :func:`_rank` in ``world_size`` processes; raises if one fails."""
    port = free_port()
    mp.start_processes(
        _rank,
        args=(world_size, port, spec, checkpoint, out_dir),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )


def _recording(loader: Iterable[Any], seen: list[int]) -> Iterator[Any]:
    for images, targets in loader:
        seen.extend(int(t["image_id"]) for t in targets)
        yield images, targets


def _rank(
    rank: int, world_size: int, port: int, spec: ExperimentSpec, checkpoint: Path, out_dir: Path
) -> None:
    from maskops.checkpoints.model_file import load_model
    from maskops.data.pipeline import build_eval_loader
    from maskops.evaluation import COCOEvaluator, TorchPredictor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share the cores
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=TIMEOUTS.init_s)
    )
    try:
        info = RankInfo(rank, world_size, rank, torch.device("cpu"))
        group = EvalGroup.create(info, TIMEOUTS)
        loaded = load_model(checkpoint)
        model, label_map = loaded.model, loaded.label_map
        amp = AmpSettings(enabled=False, device_type="cpu")
        if rank == 1:
            # As after a DDP step: each rank's batch-norm statistics are its last batch's.
            for name, buffer in model.named_buffers():
                if name.endswith("running_var"):
                    buffer.mul_(4.0)
        # The evaluation training runs, on every rank.
        metrics = coco_eval_fn(spec, info, amp, label_map, group)(model, 0)
        # The same sharded COCO evaluation, recording which images this rank ran.
        evaluator = COCOEvaluator(spec.data_config.val_json_file, label_map)
        loader = build_eval_loader(
            spec, label_map=label_map, with_masks=False, rank=rank, world_size=world_size
        )
        shard: list[int] = []
        sharded_coco_metrics(TorchPredictor(model), _recording(loader, shard), evaluator, group)
        # A cancel only rank 1 sees stops the evaluation on both ranks.
        try:
            coco_eval_fn(spec, info, amp, label_map, group, lambda: rank == 1)(model, 0)
            abandoned = False
        except EvaluationAbandoned:
            abandoned = True
        record = {
            "abandoned": abandoned,
            "metrics": metrics,
            "shard": shard,
            "gathered_ids": evaluator.image_ids if rank == 0 else None,
            "gathered_results": evaluator.results if rank == 0 else None,
            "agreed": group.all_agree(rank != 0),
        }
        (out_dir / f"rank-{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()
