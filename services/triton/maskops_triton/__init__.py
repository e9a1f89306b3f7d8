"""Triton Inference Server launch: bundled PyPI binary locally, official image in compose."""
