"""Triton python-backend models of the served ensemble (copied as ``model.py`` by publish).

They run inside Triton's python stub, which imports ``triton_python_backend_utils``; the
work itself is in :mod:`maskops.serving.processing`, so each file is a thin adapter:
tensors in, plain function, tensors out. Heavy objects (the onnxruntime session, the label
map) are built once in ``initialize``.
"""
