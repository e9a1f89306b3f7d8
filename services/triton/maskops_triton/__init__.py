"""Triton Inference Server launch: the bundled PyPI binary locally, the official image in compose."""
