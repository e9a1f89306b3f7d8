"""Persistence: SQLAlchemy 2.0 models and engine/session construction (no FastAPI here)."""
