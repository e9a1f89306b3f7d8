"""maskops REST API: the FastAPI app, its routers and services, job dispatch to the
workers, the reconciler, the job cache, and the ``serve`` and ``token`` commands.

Settings, the database models and sessions, migrations, the action catalogue and the
Celery app are the control-plane core's (``maskops_core``), which the Celery worker shares;
the API imports no module of the worker.
"""
