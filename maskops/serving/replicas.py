"""Several Triton replicas on one shared model repository.

:func:`roll_out_all` loads a version on every replica (each brings it up next to the one it
serves, as :func:`~maskops.serving.client.roll_out` does) and says how each went;
:func:`retire_all` stops serving a model everywhere; :class:`ReplicaPool` spreads inference
round-robin over the replicas that answer, each behind a circuit breaker.

Imports only :mod:`maskops.serving.client` and :mod:`maskops.serving.circuit` (the API
image has no torch nor onnx).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from maskops.serving.circuit import Circuits, ReplicasDown, probe_health
from maskops.serving.client import (
    ModelNotFound,
    TritonError,
    TritonTimeout,
    TritonUnavailable,
    infer_images,
    model_states,
    retire,
    roll_out,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Rollout:
    """What loading ``version`` of ``name`` did on each replica: None = it serves it."""

    name: str
    version: int | None
    errors: dict[str, str | None]

    @property
    def failed(self) -> dict[str, str]:
        return {url: error for url, error in self.errors.items() if error is not None}

    def states(self) -> dict[str, str]:
        """Per replica, one line: ``serves version N`` or why not."""
        served = f"serves version {self.version}" if self.version else "serves the newest version"
        return {url: error or served for url, error in self.errors.items()}

    def summary(self) -> str:
        return "; ".join(f"{url}: {state}" for url, state in self.states().items())


def _on_every(urls: Sequence[str], call: Callable[[str], T]) -> dict[str, T | TritonError]:
    """``call`` for each replica at once: per replica its answer or its error."""

    def attempt(url: str) -> T | TritonError:
        try:
            return call(url)
        except TritonError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        return dict(zip(urls, pool.map(attempt, urls), strict=True))


def _errors(outcomes: dict[str, Any]) -> dict[str, str | None]:
    return {url: str(o) if isinstance(o, TritonError) else None for url, o in outcomes.items()}


def roll_out_all(urls: Sequence[str], name: str, version: int | None = None) -> Rollout:
    """:func:`~maskops.serving.client.roll_out` on every replica at once. Never raises: the
    caller decides what a replica that failed means (a publish undoes itself everywhere)."""
    outcomes = _on_every(urls, lambda url: roll_out(url, name, version))
    return Rollout(name, version, _errors(outcomes))


def retire_all(urls: Sequence[str], name: str) -> dict[str, str | None]:
    """:func:`~maskops.serving.client.retire` on every replica; per replica None or why not."""
    return _errors(_on_every(urls, lambda url: retire(url, name)))


def states_all(urls: Sequence[str], model: str) -> dict[str, dict[str, str] | str]:
    """Per replica: :func:`~maskops.serving.client.model_states` of ``model``, or why the
    replica could not be asked."""
    outcomes = _on_every(urls, lambda url: model_states(url, model))
    return {url: str(o) if isinstance(o, TritonError) else o for url, o in outcomes.items()}


class ReplicaPool:
    """Inference spread round-robin over Triton replicas, each behind a circuit breaker
    (:mod:`maskops.serving.circuit`).

    A replica that cannot be reached has its circuit opened for ``down_for_s`` and the
    request goes on to the next one (inference has no side effect, so a retry is safe). A
    replica that takes a request and does not answer within its time has its circuit opened
    too, and that request ends (its time is spent). With every circuit open a request is
    refused at once. ``resolve`` gives the replicas (it may look them up in DNS) and is
    called again after ``refresh_s``.
    """

    def __init__(
        self,
        resolve: Callable[[], list[str]],
        *,
        refresh_s: float = 10.0,
        down_for_s: float = 5.0,
        probe: Callable[[str], bool] = probe_health,
    ) -> None:
        self._resolve, self.refresh_s, self.down_for_s = resolve, refresh_s, down_for_s
        self._lock = threading.Lock()
        self._urls: list[str] = []
        self._resolved_at = float("-inf")
        self._next = 0
        self.circuits = Circuits(open_for_s=down_for_s, probe=probe)

    def replicas(self) -> list[str]:
        """The replicas now (looked up again once ``refresh_s`` has passed). A lookup that
        fails keeps the last replicas found: a DNS hiccup must not stop inference.

        Raises:
            TritonUnavailable: the lookup failed and none was ever found (it says why).
        """
        with self._lock:
            if time.monotonic() - self._resolved_at >= self.refresh_s:
                try:
                    self._urls = list(self._resolve())
                except Exception as exc:
                    if not self._urls:
                        raise TritonUnavailable(str(exc)) from None
                self._resolved_at = time.monotonic()
            return list(self._urls)

    def rotation(self) -> list[str]:
        """The order to try the replicas in for one request, the next in turn first: those
        whose circuit is closed or due for a health probe."""
        urls = self.replicas()
        if not urls:
            raise TritonUnavailable("no Triton replica is configured")
        with self._lock:
            start, self._next = self._next % len(urls), self._next + 1
        return self.circuits.usable(urls[start:] + urls[:start])

    def refusal(self) -> ReplicasDown | None:
        """Without any I/O (the replicas last found): the error for a request no replica
        may take now, every circuit open; None when one may, or none was found yet."""
        with self._lock:
            urls = list(self._urls)
        return self.circuits.refusal(urls)

    def infer(
        self, model: str, images: Sequence[bytes], **kwargs: Any
    ) -> list[list[dict[str, Any]]]:
        """:func:`~maskops.serving.client.infer_images` on the next replica that answers.

        Raises:
            ModelNotFound: no replica serves ``model`` (every one answered so).
            ReplicasDown: no replica could answer (its circuit was open, it could not be
                reached, or it did not answer in time); the message names each one's reason.
            TritonError: the other errors of the replica that answered (a bad image...).
        """
        unreachable: dict[str, str] = {}
        missing: dict[str, ModelNotFound] = {}
        for url in self.rotation():
            if not self.circuits.admit(url):
                continue
            try:
                answer = infer_images(url, model, images, **kwargs)
            except TritonTimeout as exc:
                self.circuits.trip(url, str(exc))
                raise ReplicasDown(f"{url}: {exc}", retry_after_s=self.down_for_s) from None
            except TritonUnavailable as exc:
                self.circuits.trip(url, str(exc))
                unreachable[url] = str(exc)
            except ModelNotFound as exc:
                # Published but not loaded there (a replica that restarted and has not been
                # given its models back yet): another replica may serve it.
                missing[url] = exc
            else:
                return answer
        if unreachable or not missing:
            # Every replica named: those tried with their error, the others' circuits.
            urls = self.replicas()
            known = unreachable | _as_text(missing) | self.circuits.describe(urls)
            reasons = {url: known[url] for url in urls if url in known}
            raise ReplicasDown(
                f"no Triton replica is ready: {_listed(reasons)}",
                retry_after_s=self.circuits.wait_s(urls),
            )
        if len(missing) == 1:
            raise next(iter(missing.values()))
        raise ModelNotFound(f"no Triton replica serves {model}: {_listed(missing)}")


def _as_text(errors: dict[str, ModelNotFound]) -> dict[str, str]:
    return {url: str(exc) for url, exc in errors.items()}


def _listed(reasons: dict[str, Any]) -> str:
    return "; ".join(f"{url}: {reason}" for url, reason in reasons.items())
