"""maskops control plane: FastAPI app, database models, job dispatch and reconciliation.

The ``db``, ``settings``, ``dispatch`` and ``reconciler`` modules import no FastAPI, so the
Celery worker shares them without pulling in the web stack.
"""
