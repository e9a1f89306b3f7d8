"""Markers of tests that need what only GPU hosts have.

A condition in the decorator, not ``pytest.importorskip`` in the body: on a GPU host
without TensorRT, the body's skip would come only after the test's fixtures (training
runs, exports) had been built for nothing.
"""

from __future__ import annotations

import pytest

from maskops.export.tensorrt import tensorrt_unavailable_reason

needs_tensorrt = pytest.mark.skipif(
    tensorrt_unavailable_reason() is not None, reason="needs TensorRT and a CUDA GPU"
)
