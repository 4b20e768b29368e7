"""``ropeserve serve --workers N``: N server processes accepting on one listening socket.

The parent binds the socket, starts N workers (spawned interpreters, each with its own app, batcher, table
cache and readiness; each drains on SIGTERM as a single server does), forwards SIGTERM/SIGINT to them, replaces
a worker that dies, and exits when all have stopped. ``/metrics`` in any worker shows the whole service:
prometheus-client's multiprocess mode, with ``PROMETHEUS_MULTIPROC_DIR`` managed here (a fresh temporary
directory, or the one given, emptied at start) and removed at exit when it was created here.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ropeserve.metrics import MULTIPROC_DIR_ENV
from ropeserve.settings import Settings

logger = logging.getLogger("uvicorn.error")
Worker = Callable[[Settings, list[socket.socket]], None]
"""Runs one server on the given sockets until it stops (a module-level function; exit status via SystemExit)."""
POLL_S = 0.2
NOT_STARTED = 3
"""Exit status of a worker whose server never started (bad settings, app failure): the service stops."""


def bind(settings: Settings) -> socket.socket:
    """The shared listening socket (IPv6 when the host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def metrics_directory() -> tuple[Path, bool]:
    """``(directory, created here)``: the given PROMETHEUS_MULTIPROC_DIR emptied of old files, or a new one."""
    given = os.environ.get(MULTIPROC_DIR_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for old in path.glob("*.db"):
            old.unlink()
        return path, False
    return Path(tempfile.mkdtemp(prefix="ropeserve-metrics-")), True


class Supervisor:
    """Starts, replaces and stops the worker processes."""

    def __init__(self, settings: Settings, worker: Worker, sock: socket.socket, directory: Path) -> None:
        self.settings, self.worker, self.sock, self.directory = settings, worker, sock, directory
        self.context = multiprocessing.get_context("spawn")
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.stopping: int | None = None

    def start_one(self) -> multiprocessing.process.BaseProcess:
        process = self.context.Process(target=self.worker, args=(self.settings, [self.sock]), daemon=False)
        process.start()
        return process

    def handle(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: pass it on (a second one too: a worker then skips the rest of its drain delay)."""
        self.stopping = sig
        for process in self.processes:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, sig)

    def run(self) -> int:
        self.processes = [self.start_one() for _ in range(self.settings.workers)]
        logger.info("ropeserve: %d workers on %s:%d", len(self.processes), self.settings.host, self.settings.port)
        while any(process.exitcode is None for process in self.processes):
            time.sleep(POLL_S)
            self.replace_dead()
        statuses = [process.exitcode for process in self.processes]
        return 0 if all(status == 0 for status in statuses) else NOT_STARTED

    def replace_dead(self) -> None:
        from prometheus_client import multiprocess

        for index, process in enumerate(self.processes):
            if process.exitcode is None or process.pid is None:
                continue
            multiprocess.mark_process_dead(process.pid, str(self.directory))  # type: ignore[no-untyped-call]
            if self.stopping is None and process.exitcode == NOT_STARTED:
                logger.error("ropeserve: worker %d could not start; stopping", process.pid)
                self.handle(signal.SIGTERM, None)
            elif self.stopping is None:
                logger.error("ropeserve: worker %d exited with %s; starting another", process.pid, process.exitcode)
                self.processes[index] = self.start_one()


def run_workers(settings: Settings, worker: Worker) -> int:
    """Serve with ``settings.workers`` processes running ``worker``; returns when all have stopped."""
    directory, created = metrics_directory()
    os.environ[MULTIPROC_DIR_ENV] = str(directory)
    try:
        with bind(settings) as sock:
            supervisor = Supervisor(settings, worker, sock, directory)
            previous = {sig: signal.signal(sig, supervisor.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                return supervisor.run()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
    finally:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(KeyError):
            del os.environ[MULTIPROC_DIR_ENV]
