"""The control plane's side of serving, over the engine's Triton client
(:mod:`maskops.serving`):

- :mod:`maskops_api.serving.replicas`: the API's pool of Triton replicas (``/infer``
  spreads requests over it) and each replica's state (``/readyz``, ``GET /models/{name}``);
- :mod:`maskops_api.serving.published`: loads every published model into a Triton that
  does not serve it (the reconciler on every pass, ``maskops serve`` once its Triton is up).

Where the replicas are is configuration: ``Settings.triton_replicas``
(``MASKOPS_TRITON_URL``, ``MASKOPS_TRITON_DNS``).
"""
