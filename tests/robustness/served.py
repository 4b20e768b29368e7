"""``ropeserve serve``'s server (``server_config`` + ``DrainingServer``, uvloop + httptools) in a thread of the test
process on 127.0.0.1, so a test can reach the app's runtime (budget, patched parsers) while clients use real
sockets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI

from ropeserve.api import create_app
from ropeserve.api.app import DrainingServer
from ropeserve.api.runtime import Runtime
from ropeserve.api.transport import server_config
from ropeserve.settings import Settings
from support import wait_for


@dataclass
class Served:
    app: FastAPI
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime(self) -> Runtime:
        return self.app.state.runtime  # type: ignore[no-any-return]


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serving(app: FastAPI | None = None, **settings: object) -> Iterator[Served]:
    """Serve ``app`` (default ``create_app`` of ``settings``) until the block ends; yields once ready."""
    config = Settings(access_log=False, device="cpu", **settings)  # type: ignore[arg-type]
    app = app or create_app(config)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    server = DrainingServer(server_config(app, config), app.state.runtime)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    served = Served(app, listener.getsockname()[1])
    try:
        wait_for(lambda: ready(served.url), 60, "the in-process server to be ready", interval=0.1)
        yield served
    finally:
        server.should_exit = True
        thread.join(30)
        listener.close()
