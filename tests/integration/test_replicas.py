"""deploy/replicas.py: two replicas behind nginx on loopback share the traffic and keep request ids."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from integration_support import COS_SIN, COS_SIN_BODY, REPO, server_env

pytestmark = pytest.mark.deploy
REQUESTS = 16

# Runs inside `replicas.py -- python -c ...` with ROPESERVE_URL set: traffic, then a JSON report on stdout.
CLIENT = textwrap.dedent(
    f"""
    import json, os, httpx
    url = os.environ["ROPESERVE_URL"]
    with httpx.Client(base_url=url, timeout=30) as client:
        responses = [client.post({COS_SIN!r}, json={COS_SIN_BODY!r}) for _ in range({REQUESTS})]
        echoed = client.get("/v1/info", headers={{"X-Request-ID": "via-nginx-1"}}).headers["x-request-id"]
        minted = client.get("/v1/info").headers["x-request-id"]
    print(json.dumps({{
        "statuses": [r.status_code for r in responses],
        "upstreams": [r.headers.get("x-upstream") for r in responses],
        "echoed": echoed,
        "minted": minted,
    }}))
    """
)


@pytest.mark.timeout(120)
def test_two_replicas_behind_nginx_share_the_traffic(tool, tmp_path: Path) -> None:
    tool("nginx")
    demo = [sys.executable, str(REPO / "deploy/replicas.py"), "--replicas", "2", "--port", "0"]
    command = [*demo, "--", sys.executable, "-c", CLIENT]
    result = subprocess.run(command, env=server_env(), capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    url, report_line = result.stdout.strip().splitlines()[-2:]
    report = json.loads(report_line)

    assert url.startswith("http://127.0.0.1:")
    assert report["statuses"] == [200] * REQUESTS
    replicas = result.stderr.split("replica(s):", 1)[1].split("\n", 1)[0].split()
    assert {f"http://{addr}" for addr in report["upstreams"]} == set(replicas) and len(replicas) == 2
    assert report["echoed"] == "via-nginx-1"
    assert len(report["minted"]) == 32  # nginx's $request_id, passed to the replica and echoed back
