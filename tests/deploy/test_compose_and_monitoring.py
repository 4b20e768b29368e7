"""docker-compose.yml (compose spec), the Prometheus config (promtool) and Grafana provisioning + dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import REPO

from ropeserve.settings import Settings

pytestmark = pytest.mark.deploy
COMPOSE_FILES = ("docker-compose.yml", "deploy/docker-compose.gpu.yml")
# Each panel topic the issue asks for, and a metric that must appear in that panel's queries.
DASHBOARD_TOPICS = {
    "request rate": "ropeserve_http_requests_total",
    "latency percentiles": "ropeserve_http_request_duration_seconds_bucket",
    "errors by type": "ropeserve_http_errors_total",
    "batch size": "ropeserve_batch_size_requests_bucket",
    "queue time": "ropeserve_batch_queue_seconds_bucket",
    "in-flight": "ropeserve_http_requests_in_flight",
}


def load_yaml(path: str) -> Any:
    return yaml.safe_load((REPO / path).read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml("docker-compose.yml")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads((REPO / "deploy/grafana/dashboards/ropeserve.json").read_text())


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path of each ``./`` bind mount."""
    mounts = [volume.split(":") for volume in service.get("volumes", [])]
    return {target: REPO / source for source, target, *_ in mounts if source.startswith("./")}


def test_compose_files_follow_the_compose_specification(tool) -> None:
    result = tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", *COMPOSE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_services_start_in_order_of_health(compose) -> None:
    services = compose["services"]
    assert set(services) == {"ropeserve", "prometheus", "grafana"}
    assert services["prometheus"]["depends_on"] == {"ropeserve": {"condition": "service_healthy"}}
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    assert "healthcheck" in services["ropeserve"] and "healthcheck" in services["prometheus"]
    assert services["ropeserve"]["build"]["context"] == "." and (REPO / "Dockerfile").is_file()


def test_ports_are_published_on_loopback_only(compose) -> None:
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"
    assert f"127.0.0.1:8000:{Settings().port}" in compose["services"]["ropeserve"]["ports"]


def test_bind_mounts_exist(compose) -> None:
    for service in compose["services"].values():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{source} (mounted at {target})"


def test_prometheus_scrapes_the_compose_service(compose) -> None:
    config = load_yaml("deploy/prometheus/prometheus.yml")
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "ropeserve"]
    assert job["static_configs"][0]["targets"] == [f"ropeserve:{Settings().port}"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    mounted = bind_mounts(compose["services"]["prometheus"])
    assert mounted["/etc/prometheus"] == REPO / "deploy/prometheus"


@pytest.mark.parametrize("check", ["config deploy/prometheus/prometheus.yml", "rules deploy/prometheus/alerts.yml"])
def test_promtool_accepts_the_config_and_rules(tool, check: str) -> None:
    result = tool("promtool", "check", *check.split())
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_with_the_datasource_and_dashboard(compose, dashboard) -> None:
    mounts = bind_mounts(compose["services"]["grafana"])
    provisioning = mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards/ropeserve.yml").read_text())["providers"]
    dashboards_dir = mounts[provider["options"]["path"]]
    assert (dashboards_dir / "ropeserve.json").is_file()
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == provider["options"]["path"] + "/ropeserve.json"
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == source["type"]


def datasource_references(node: Any) -> list[dict[str, Any]]:
    """Every ``datasource`` object anywhere in the dashboard."""
    if isinstance(node, dict):
        found = [node["datasource"]] if isinstance(node.get("datasource"), dict) else []
        return found + [ref for value in node.values() for ref in datasource_references(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in datasource_references(value)]
    return []


def test_dashboard_imports_into_any_grafana(dashboard) -> None:
    """No hard-coded datasource uid: every query follows the dashboard's datasource variable."""
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    references = datasource_references(dashboard)
    assert references and all(ref["uid"] == "${" + variable["name"] + "}" for ref in references), references


def test_dashboard_shows_latency_per_route_and_a_5xx_only_error_ratio(dashboard) -> None:
    exprs = {panel["title"]: [t["expr"] for t in panel["targets"]] for panel in dashboard["panels"]}
    per_route = [e for queries in exprs.values() for e in queries if "sum by (le, route)" in e]
    assert per_route and all("ropeserve_http_request_duration_seconds_bucket" in e for e in per_route)
    (ratio,) = [queries for title, queries in exprs.items() if "error ratio" in title.lower()]
    numerator, denominator = ratio[0].split(" / ")
    assert 'status=~"5.."' in numerator and "status" not in denominator


def test_dashboard_covers_the_operator_questions(dashboard) -> None:
    panels = {panel["title"].lower(): " ".join(t["expr"] for t in panel["targets"]) for panel in dashboard["panels"]}
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    for topic, metric in DASHBOARD_TOPICS.items():
        matching = [queries for title, queries in panels.items() if topic in title]
        assert matching, f"no panel titled with {topic!r}"
        assert any(metric in queries for queries in matching), f"{topic!r} panel does not query {metric}"
    latency = next(queries for title, queries in panels.items() if "latency percentiles" in title)
    assert all(f"histogram_quantile({q}," in latency for q in ("0.5", "0.9", "0.99"))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_description_and_a_runbook_section() -> None:
    doc = (REPO / "docs/operations.md").read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", doc, re.MULTILINE)}
    rules = [rule for group in load_yaml("deploy/prometheus/alerts.yml")["groups"] for rule in group["rules"]]
    for rule in rules:
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert path == "docs/operations.md" and anchor in anchors, f"{rule['alert']}: no section #{anchor}"
