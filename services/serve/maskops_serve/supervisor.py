"""``maskops serve`` keeps its worker and Triton running.

Each child runs in its own session (process group), and dies with ``maskops serve`` even
when serve is SIGKILLed (Linux's parent-death signal). A thread per child waits for it to
exit, reaps it, kills what is left of its group (a killed Celery main process leaves its
pool child, a killed tritonserver its python backend stubs), logs why, and starts it again
after a back-off (1 s doubling to 60 s; back to 1 s once a child ran for a minute).
``/readyz`` and ``/infer`` read :attr:`SupervisedChild.problem`: what is wrong right now,
in words ("Triton is starting", "Triton exited with code -9, restarting in 2 s").
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from maskops.process_groups import kill_group
from maskops_api.serving.published import published_names, serve_published
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings

Say = Callable[[str], None]


class Backoff:
    """Delays before restarting a child: doubling from ``first_s`` up to ``limit_s``; a child
    that ran ``stable_s`` or longer before dying starts over at ``first_s``."""

    def __init__(self, first_s: float = 1.0, limit_s: float = 60.0, stable_s: float = 60.0):
        self.first_s, self.limit_s, self.stable_s = first_s, limit_s, stable_s
        self._next_s = first_s

    def delay(self, ran_s: float) -> float:
        if ran_s >= self.stable_s:
            self._next_s = self.first_s
        delay, self._next_s = self._next_s, min(self._next_s * 2, self.limit_s)
        return delay


class SupervisedChild(threading.Thread):
    """Start a child, watch it, restart it with back-off until :meth:`stop`."""

    what = "child"

    def __init__(self, say: Say) -> None:
        super().__init__(name=f"supervise-{self.what.lower()}", daemon=True)
        self.say = say
        self.problem: str | None = f"{self.what} is starting"
        """What is wrong with the child now; None when it runs (as far as we know)."""
        self.stopping = threading.Event()
        self._stopped = threading.Event()
        # Held while starting or stopping the child, so that stop() never races a start.
        self._lock = threading.Lock()
        self.backoff = Backoff()
        self.on_launch: Callable[[str, int], None] | None = None
        """Called with :attr:`what` and the pid (= process group) of each new child."""

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def launch(self) -> None:
        raise NotImplementedError

    def watch(self) -> str | None:
        """Block while the child runs; why it ended, or None when stopping."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Reap the child and kill what is left of its process group."""
        raise NotImplementedError

    def terminate(self) -> None:
        """Stop the child for good (the stack is stopping)."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            self._supervise()
        finally:
            # This thread starts the children, so to Linux it is their parent: they die
            # with it (``dies_with_parent``). It stays until stop() stopped the child its
            # own way (a warm shutdown, Triton unloading its models).
            self._stopped.wait()

    def _supervise(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            with self._lock:
                if self.stopping.is_set():
                    return
                try:
                    self.launch()
                    reason: str | None = None
                    if self.on_launch is not None and self.pid is not None:
                        self.on_launch(self.what, self.pid)
                except Exception as exc:
                    reason = f"could not start ({exc})"
            if reason is None:
                reason = self.watch()
            if self.stopping.is_set() or reason is None:
                return
            # Said before the cleanup, which may take seconds (a group to kill, jobs to
            # requeue): meanwhile the dead worker's last heartbeat still looks fresh.
            self.problem = f"{self.what} {reason}"
            with self._lock:
                self.cleanup()
            delay = self.backoff.delay(time.monotonic() - started)
            self.problem = f"{self.what} {reason}, restarting in {delay:.0f} s"
            self.say(f"{self.what.lower()}: {reason}; restarting in {delay:.0f} s")
            self.stopping.wait(delay)
            self.problem = f"{self.what} is starting"

    def stop(self) -> None:
        self.stopping.set()
        try:
            with self._lock:
                self.terminate()
        finally:
            self._stopped.set()
        self.join(30)


class WorkerSupervisor(SupervisedChild):
    """The Celery worker. It counts as up once it has written its heartbeat row (``/readyz``
    checks that against :attr:`pid`)."""

    what = "Worker"

    def __init__(
        self,
        start: Callable[[], subprocess.Popen[bytes]],
        stop: Callable[[subprocess.Popen[bytes]], None],
        on_lost: Callable[[], None],
        say: Say,
    ) -> None:
        super().__init__(say)
        # Not _start/_stop: threading.Thread uses those names itself.
        self.start_process, self.stop_process, self.on_lost = start, stop, on_lost
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def launch(self) -> None:
        self.process = self.start_process()
        self.problem = None

    def watch(self) -> str | None:
        assert self.process is not None
        while not self.stopping.wait(0.5):
            code = self.process.poll()
            if code is not None:
                return f"exited with code {code}"
        return None

    def cleanup(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            kill_group(process.pid)
            process.wait()
        # The stack's only worker is gone: what it was running is requeued now rather
        # than after the heartbeat timeout.
        try:
            self.on_lost()
        except Exception as exc:
            self.say(f"worker: could not requeue its jobs ({exc}); the reconciler will")

    def terminate(self) -> None:
        if self.process is not None:
            self.stop_process(self.process)
            kill_group(self.process.pid)


class TritonSupervisor(SupervisedChild):
    """Triton, started with no model loaded; once it is ready, every published model
    (``models`` rows with ``published``) is loaded, nothing else in the repository."""

    what = "Triton"

    def __init__(
        self,
        make_server: Callable[[], Any],
        settings: Settings,
        say: Say,
        *,
        startup_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(say)
        self.make_server = make_server
        self.settings = settings
        self.startup_timeout_s = startup_timeout_s
        self.server: Any = None

    @property
    def pid(self) -> int | None:
        pid = None if self.server is None else self.server.pid
        return None if pid is None else int(pid)

    def launch(self) -> None:
        self.problem = "Triton is starting"
        self.server = self.make_server()
        self.server.launch()

    def watch(self) -> str | None:
        deadline = time.monotonic() + self.startup_timeout_s
        loaded = False
        while not self.stopping.wait(0.5):
            code = self.server.poll()
            if code is not None:
                return f"exited with code {code}"
            if not loaded and self.server.is_ready():
                self.load_published()
                loaded = True
            elif not loaded and time.monotonic() > deadline:
                return f"was not ready after {self.startup_timeout_s:.0f} s"
        return None

    def load_published(self) -> None:
        engine = make_engine(self.settings)
        try:
            factory = make_session_factory(engine)
            names = published_names(factory)
            if names:
                self.problem = f"Triton is loading the published models {', '.join(names)}"
            served = serve_published(factory, self.server.http_url)
        finally:
            engine.dispose()
        failed = served.failed
        self.problem = f"published models did not load: {'; '.join(failed)}" if failed else None
        if self.stopping.is_set():
            return
        self.say(
            f"triton: ready at http://{self.server.http_url}; loaded {names or 'no models'}"
            + (f"; failed: {failed}" if failed else "")
        )

    def cleanup(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def terminate(self) -> None:
        if self.server is not None:
            self.server.stop()


class Supervision:
    """The children of ``maskops serve``; the API reads it as ``app.state.supervisor``."""

    def __init__(self, worker: WorkerSupervisor, triton: TritonSupervisor | None) -> None:
        self.worker, self.triton = worker, triton

    def start(self) -> None:
        self.worker.start()
        if self.triton is not None:
            self.triton.start()

    def stop(self) -> None:
        self.worker.stop()
        if self.triton is not None:
            self.triton.stop()
