"""The ``preprocess`` part (Triton python backend); see ``model.py``."""
