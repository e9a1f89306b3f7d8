"""The ``network`` part (Triton python backend); see ``model.py``."""
