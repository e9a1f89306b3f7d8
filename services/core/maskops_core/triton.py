"""Where the Triton replicas are: ``MASKOPS_TRITON_URL``'s list, plus every address
``MASKOPS_TRITON_DNS`` resolves to (docs/operations.md#several-triton-replicas)."""

from __future__ import annotations

import socket

from maskops_core.settings import Settings, split_endpoint


class ReplicaLookupError(RuntimeError):
    """``MASKOPS_TRITON_DNS`` does not resolve."""


def triton_replicas(settings: Settings) -> list[str]:
    """``host:port`` of every Triton replica, each once, in a stable order.

    Raises:
        ReplicaLookupError: ``triton_dns`` is set and its name does not resolve.
    """
    replicas = list(settings.triton_endpoints)
    if settings.triton_dns:
        replicas += resolve_all(settings.triton_dns)
    return list(dict.fromkeys(replicas))


def resolve_all(endpoint: str) -> list[str]:
    """``host:port`` for every address ``endpoint``'s host name resolves to, sorted."""
    host, port = split_endpoint(endpoint)
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ReplicaLookupError(
            f"MASKOPS_TRITON_DNS {endpoint}: {host} does not resolve ({exc})"
        ) from None
    addresses = sorted({str(info[4][0]) for info in infos})
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]
