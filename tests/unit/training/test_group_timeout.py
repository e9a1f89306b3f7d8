"""The collective timeout is set on torch 2.11 (no ``torch.distributed.set_timeout``) as on
the lock's torch."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from maskops.training.distributed import set_group_timeout


@pytest.fixture
def one_rank_group(tmp_path: Path):
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp_path / 'store'}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
    )
    yield dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    dist.destroy_process_group()


@pytest.mark.parametrize("torch_has_set_timeout", [True, False])
def test_the_group_timeout_changes(one_rank_group, monkeypatch, torch_has_set_timeout):
    if not torch_has_set_timeout:  # what torch 2.11 offers
        monkeypatch.delattr(dist, "set_timeout", raising=False)
    assert one_rank_group.options._timeout == timedelta(seconds=60)
    set_group_timeout(timedelta(seconds=123))
    assert one_rank_group.options._timeout == timedelta(seconds=123)
