"""Seeding every random-number generator a run uses (their state is saved and restored by
:mod:`maskops.checkpoints.rng_state`)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
