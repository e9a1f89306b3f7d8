"""The ``postprocess`` part (Triton python backend); see ``model.py``."""
