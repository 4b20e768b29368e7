#!/usr/bin/env python3
"""Run N ropeserve replicas on loopback behind nginx: scale-out on one machine.

    python deploy/replicas.py --replicas 3              # prints the URL, runs until Ctrl-C / SIGTERM
    python deploy/replicas.py -n 2 -- CMD [ARGS...]     # runs CMD with ROPESERVE_URL set, then stops

Each replica is ``ropeserve serve`` on its own free loopback port; nginx (Debian package, run in the
foreground with a temporary prefix, no system service) balances them with least_conn and adds an
``X-Upstream`` header naming the replica that answered. Everything stops, and the temporary directory
is removed, on exit. ROPESERVE_* variables pass through to the replicas; unless OMP_NUM_THREADS is set,
each replica gets an equal share of the cores so 1-vs-N comparisons do not oversubscribe them.

From Python (the load kit): ``with replicas(2) as cluster: ... cluster.url ...``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "nginx" / "nginx.conf.template"
STARTUP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Cluster:
    url: str
    replica_urls: tuple[str, ...]
    workdir: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nginx_binary() -> str:
    candidates = (shutil.which("nginx"), "/usr/sbin/nginx", "/sbin/nginx")
    found = next((path for path in candidates if path and os.access(path, os.X_OK)), None)
    if found is None:
        raise RuntimeError("nginx not found: install the Debian package (scripts/system-deps does, as root)")
    return found


def render_nginx_conf(prefix: Path, port: int, upstream_ports: Sequence[int]) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;" for p in upstream_ports)
    text = TEMPLATE.read_text()
    return text.replace("@PREFIX@", str(prefix)).replace("@PORT@", str(port)).replace("@SERVERS@", servers)


def wait_ready(url: str, procs: Sequence[subprocess.Popen[bytes]], timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll ``url`` + /health/ready until it answers 200; fail early if a process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url + "/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def dump_logs(workdir: Path, lines: int = 20) -> None:
    for log in sorted(workdir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name}", *tail, sep="\n", file=sys.stderr)


def replica_env(n: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("ROPESERVE_ACCESS_LOG", "false")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    env["ROPESERVE_HOST"] = "127.0.0.1"
    return env


def start_replica(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ropeserve.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def start_nginx(workdir: Path, port: int, upstream_ports: Sequence[int]) -> subprocess.Popen[bytes]:
    workdir.chmod(0o755)  # nginx workers (an unprivileged user when run as root) create temp dirs inside
    conf = workdir / "nginx.conf"
    conf.write_text(render_nginx_conf(workdir, port, upstream_ports))
    with (workdir / "nginx.log").open("wb") as out:
        return subprocess.Popen(
            [nginx_binary(), "-p", str(workdir), "-e", "stderr", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )


@contextmanager
def replicas(n: int, port: int = 0) -> Iterator[Cluster]:
    """Start ``n`` replicas and nginx on ``port`` (0: a free one); yield once all answer ready."""
    if n < 1:
        raise ValueError("need at least one replica")
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ropeserve-replicas-")))
        ports = [free_port() for _ in range(n)]
        env = replica_env(n)
        procs = []
        for i, replica_port in enumerate(ports):
            proc = start_replica(replica_port, env, workdir / f"replica-{i}.log")
            stack.callback(stop, proc)
            procs.append(proc)
        urls = tuple(f"http://127.0.0.1:{p}" for p in ports)
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        try:
            for replica_url in urls:
                wait_ready(replica_url, procs)
            nginx = start_nginx(workdir, port, ports)
            stack.callback(stop, nginx, signal.SIGQUIT)
            wait_ready(url, [nginx, *procs], timeout=20)
        except Exception:
            dump_logs(workdir)
            raise
        yield Cluster(url=url, replica_urls=urls, workdir=workdir)


def wait_for_signal() -> None:
    with suppress(KeyboardInterrupt):
        signal.pause()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="N ropeserve replicas on loopback behind nginx.")
    parser.add_argument("-n", "--replicas", type=int, default=2, help="how many replicas (default 2)")
    parser.add_argument("-p", "--port", type=int, default=8080, help="nginx port on 127.0.0.1 (0: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: run this with ROPESERVE_URL set")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with replicas(args.replicas, args.port) as cluster:
        print(cluster.url, flush=True)
        print(f"{args.replicas} replica(s): {' '.join(cluster.replica_urls)}", file=sys.stderr, flush=True)
        if not args.command:
            print("Ctrl-C or SIGTERM stops everything.", file=sys.stderr, flush=True)
            wait_for_signal()
            return 0
        env = {**os.environ, "ROPESERVE_URL": cluster.url}
        return subprocess.run(args.command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
