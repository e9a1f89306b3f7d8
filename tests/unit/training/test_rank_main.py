"""How a training rank's process ends: with its exit code, after its atexit handlers, and
without the interpreter's finalization (where gloo's surviving worker threads can abort
a rank whose run succeeded)."""

from __future__ import annotations

import subprocess
import sys

ENDING_RANK = """
import atexit
from maskops.training.rank_main import exit_before_finalization

class Finalized:
    def __del__(self) -> None:
        print("finalized", flush=True)

kept = Finalized()
atexit.register(print, "atexit ran")
print("buffered", end="")
exit_before_finalization(3)
"""


def test_a_rank_exits_with_its_code_after_its_atexit_handlers_and_before_finalization() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ENDING_RANK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-3000:]
    # Output still buffered is written; a module global is never finalized.
    assert done.stdout == "bufferedatexit ran\n"
