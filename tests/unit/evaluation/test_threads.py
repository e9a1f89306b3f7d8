"""The post-processing pool runs torch single-threaded without changing anyone else's."""

from __future__ import annotations

import multiprocessing
import threading

import torch

from maskops.evaluation.postprocess import paste_masks_rle
from maskops.evaluation.threads import map_single_threaded, postprocess_pool, run_single_threaded


def _threads_in_new_thread() -> int:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def test_pool_threads_use_one_torch_thread_and_leave_the_default_alone() -> None:
    before = torch.get_num_threads()
    postprocess_pool()
    assert run_single_threaded(torch.get_num_threads) == 1
    assert set(map_single_threaded(lambda _: torch.get_num_threads(), range(8))) == {1}
    assert torch.get_num_threads() == before
    assert _threads_in_new_thread() == before


def _paste_in_child(queue: multiprocessing.Queue) -> None:
    rles = paste_masks_rle(torch.tensor([[2.0, 2.0, 20.0, 20.0]]), torch.ones(1, 28, 28), (32, 32))
    queue.put(rles[0]["size"])


def test_pool_works_in_a_forked_child() -> None:
    postprocess_pool()  # the parent's threads do not exist in the child
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_paste_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == [32, 32]
