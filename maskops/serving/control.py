"""Who may control Triton: its model-control key, with no engine import.

Triton's model control (load and unload, with the load request able to carry a model's
files, a python backend's ``model.py`` included) runs code as the server's user. So the
server is told to refuse those endpoints, and the other administrative ones, to any
request without a secret header (Triton's ``--http-restricted-api``), and only the
control plane, which publishes, knows the secret:

- the processes that load models (the worker's publish, the API's reconciler, ``maskops
  publish --triton_url``) read it from :data:`CONTROL_KEY_ENV`;
- the server gets :func:`restricted_api_argument`, from ``maskops serve`` (a key made
  fresh for each start) or from the Triton image's entrypoint (the same variable).

Inference, health and metadata stay open to whoever reaches the server, which listens on
loopback (``maskops serve``) or on the compose network alone (no published port).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping

CONTROL_KEY_ENV = "MASKOPS_TRITON_CONTROL_KEY"
"""The environment variable holding the key, in every process that controls Triton."""
CONTROL_HEADER = "maskops-control-key"
"""The HTTP header that carries the key to Triton."""
RESTRICTED_APIS: tuple[str, ...] = ("model-repository", "shared-memory", "logging", "trace")
"""Triton's API groups that need the key: model load/unload and the repository index;
shared memory (registers host memory regions); logging and trace (write files)."""
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")
"""A key Triton's flag can carry as it is (no ``,``, ``:`` or ``=``), long enough."""


class ControlKeyError(ValueError):
    """A control key that is missing or not of :data:`KEY_PATTERN`."""


def new_control_key() -> str:
    """A fresh random key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_control_key(key: str) -> str:
    """``key`` if it follows :data:`KEY_PATTERN`; else :class:`ControlKeyError`."""
    if not KEY_PATTERN.fullmatch(key):
        raise ControlKeyError(
            f"{CONTROL_KEY_ENV} must be 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'"
            f" (make one: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return key


def restricted_api_argument(key: str) -> str:
    """Triton's flag that puts :data:`RESTRICTED_APIS` behind ``key``."""
    apis = ",".join(RESTRICTED_APIS)
    return f"--http-restricted-api={apis}:{CONTROL_HEADER}={check_control_key(key)}"


def control_headers(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The header that authorises model control, or none when no key is set (a server
    started without one, as the tests' own servers are, needs none)."""
    key = environ.get(CONTROL_KEY_ENV, "")
    return {CONTROL_HEADER: key} if key else {}
