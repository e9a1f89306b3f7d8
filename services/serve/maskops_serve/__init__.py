"""``maskops serve``: the whole stack on one machine (the ``serve`` extra).

The REST API, a Celery worker and Triton as supervised child processes on embedded
defaults (SQLite, a broker that needs no server), the demo dataset, and the demo walk over
HTTP. It imports the API, the worker's start-up and the engine's demo data, so it lives
outside the API package: every module of :mod:`maskops_api` imports where the API image
runs (no torch), and this package is installed only where the whole stack runs.
"""
