"""The control-plane core shared by the API (``maskops_api``) and the workers
(``maskops_worker``): settings, the database models, sessions and migrations, job state
transitions, the action catalogue, experiment versions (``experiments``) and sending jobs
to the broker (``dispatch``). It imports neither of them, and of the engine only
the modules that need nothing but the standard library (``maskops.atomic``,
``maskops.shape_rules``, ``maskops.path_rules``, ``maskops.export.options``: rules both
sides apply)."""
