"""Start real ropeserve servers on loopback for tests and load runs (needs the ``ropeserve`` package installed).

::

    with LocalServer() as server:
        with Client(server.url) as client:
            client.info()

Each replica is ``uvicorn ropeserve.api:create_app --factory`` in its own process, listening on a socket this
process binds to a free 127.0.0.1 port and hands over (``--fd``), so there is no race for the port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Self

import httpx

__all__ = ["LocalServer"]

QUIET_ENV = {"ROPESERVE_ACCESS_LOG": "false", "ROPESERVE_DEVICE": "cpu"}


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it (uvicorn --fd skips it)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class LocalServer:
    """``replicas`` ropeserve processes on 127.0.0.1; ``urls`` once started, ``url`` is the first.

    * **env** - extra environment for the servers (e.g. ``{"ROPESERVE_BATCH_QUEUE_SIZE": "4"}``); the access log
      is off and the device is CPU unless set here.
    * **startup_timeout** - seconds to wait for ``/health/ready``.
    """

    def __init__(
        self,
        replicas: int = 1,
        *,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        python: str = sys.executable,
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.replicas = replicas
        self.env = {**os.environ, **QUIET_ENV, **(env or {})}
        self.startup_timeout = startup_timeout
        self.python = python
        self.urls: list[str] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        if not self.urls:
            raise RuntimeError("LocalServer is not started")
        return self.urls[0]

    @property
    def pids(self) -> list[int]:
        """Process ids of the running replicas."""
        return [process.pid for process in self._processes]

    def start(self) -> Self:
        try:
            for _ in range(self.replicas):
                self._spawn()
            for process, url, log in zip(self._processes, self.urls, self._logs, strict=True):
                self._wait_ready(process, url, log)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self) -> None:
        sock = _listening_socket()
        try:
            log = tempfile.TemporaryFile(prefix="ropeserve-server-")  # noqa: SIM115 - closed by stop()
            command = [
                self.python, "-m", "uvicorn", "ropeserve.api:create_app", "--factory",
                "--fd", str(sock.fileno()), "--log-level", "warning", "--no-access-log",
            ]  # fmt: skip
            process = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, pass_fds=(sock.fileno(),)
            )
            port = sock.getsockname()[1]
        finally:
            sock.close()
        self._processes.append(process)
        self._logs.append(log)
        self.urls.append(f"http://127.0.0.1:{port}")

    def _wait_ready(self, process: subprocess.Popen[bytes], url: str, log: IO[bytes]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(base_url=url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"ropeserve at {url} exited with {process.returncode}:\n{_tail(log)}")
                try:
                    if http.get("/health/ready").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"ropeserve at {url} not ready after {self.startup_timeout} s:\n{_tail(log)}")

    def log_text(self, replica: int = 0) -> str:
        """What replica ``replica`` printed so far (warnings and errors)."""
        return _tail(self._logs[replica], limit=None)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every replica (uvicorn drains in-flight requests), SIGKILL after ``grace`` seconds."""
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self._logs:
            log.close()
        self._processes, self._logs, self.urls = [], [], []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _tail(log: IO[bytes], limit: int | None = 4000) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    log.seek(0, os.SEEK_END)
    return text if limit is None else text[-limit:]
