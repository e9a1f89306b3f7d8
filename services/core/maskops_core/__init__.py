"""The control-plane core shared by the API (``maskops_api``) and the workers
(``maskops_worker``): settings, the database models, sessions and migrations, job state
transitions and the action catalogue. It imports neither of them, nor the engine."""
