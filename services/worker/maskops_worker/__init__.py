"""maskops Celery worker: one task per job action, each a thin wrapper over ``run_job``."""
