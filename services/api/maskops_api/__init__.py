"""The REST API (FastAPI): what the ``api`` image runs, with no PyTorch and no ONNX.

- ``main``: the app factory; ``server``: the deployment's process (migrations, then serve).
- ``routes/``: one thin router per resource; ``services/``: the writes they make.
- ``middleware/``: body limits, Host/Origin checks, the status shortcut, observability.
- ``cache/``: job statuses and verified tokens kept in memory between requests.
- ``reconciler``: keeping the broker in step with the database (sending a job is
  :mod:`maskops_core.dispatch`'s); ``published``: Triton loads what is published.

Settings, the database models and sessions, migrations, the action catalogue, the Celery
app and sending jobs to it are the control-plane core's (:mod:`maskops_core`), which the
Celery worker shares; the API imports no module of the worker. The single-machine stack
(``maskops serve``) lives in :mod:`maskops_serve`.
"""
