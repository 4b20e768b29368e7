"""deploy/k8s: core resources validated with kubernetes-validate (offline schemas); CRDs, kustomize files and
the prometheus-adapter rules checked for the fields that make them work together."""

from __future__ import annotations

import copy
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
NO_SCHEMA_KINDS = {"ServiceMonitor", "Kustomization"}  # CRD / kustomize config: checked field by field below


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def base_resources() -> dict[str, dict[str, Any]]:
    """kind -> resource, for every file the base kustomization lists."""
    kustomization = load(BASE / "kustomization.yaml")
    resources = [load(BASE / name) for name in kustomization["resources"]]
    return {resource["kind"]: resource for resource in resources}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return main


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container(deployment)["env"]}


def strategic_merge(base: Any, patch: Any) -> Any:
    """Enough of kubectl's strategic merge for our patches: maps merge, lists of named items merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i for i in patch):
        by_name = {item["name"]: item for item in base}
        merged_list = [strategic_merge(by_name[i["name"]], i) if i["name"] in by_name else i for i in patch]
        return [item for item in base if item["name"] not in {i["name"] for i in patch}] + merged_list
    return patch


@pytest.fixture(scope="module")
def resources() -> dict[str, dict[str, Any]]:
    return base_resources()


def test_core_resources_validate_strictly(tool) -> None:
    files = [p for p in sorted(BASE.glob("*.yaml")) if load(p)["kind"] not in NO_SCHEMA_KINDS]
    assert {load(p)["kind"] for p in files} >= {"Deployment", "Service", "HorizontalPodAutoscaler"}
    result = tool("kubernetes-validate", "--strict", "--quiet", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_overlay_patch_yields_a_valid_deployment(tool, resources, tmp_path: Path) -> None:
    overlay = load(K8S / "overlays/gpu/kustomization.yaml")
    assert overlay["resources"] == ["../../base"]
    (patch_ref,) = overlay["patches"]
    assert patch_ref["target"] == {"kind": "Deployment", "name": resources["Deployment"]["metadata"]["name"]}
    patched = strategic_merge(copy.deepcopy(resources["Deployment"]), load(K8S / "overlays/gpu" / patch_ref["path"]))
    assert container(patched)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env_of(patched)["ROPESERVE_DEVICE"] == "cuda"
    assert len(container(patched)["env"]) == len(container(resources["Deployment"])["env"]) + 1
    (tmp_path / "gpu-deployment.yaml").write_text(yaml.safe_dump(patched))
    result = tool("kubernetes-validate", "--strict", "--quiet", tmp_path / "gpu-deployment.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_kustomizations_name_existing_files() -> None:
    for path in K8S.rglob("kustomization.yaml"):
        kustomization = load(path)
        assert (
            kustomization["apiVersion"].startswith("kustomize.config.k8s.io/")
            and kustomization["kind"] == "Kustomization"
        )
        named = kustomization.get("resources", []) + [p["path"] for p in kustomization.get("patches", [])]
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


def test_service_and_service_monitor_select_the_pods(resources) -> None:
    pod_labels = resources["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service, monitor = resources["Service"], resources["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"


def test_autoscaler_metrics_are_served_by_the_adapter_rules(resources) -> None:
    hpa, deployment = resources["HorizontalPodAutoscaler"], resources["Deployment"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 1 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    adapter = load(K8S / "prometheus-adapter/values.yaml")
    served = set()
    for rule in adapter["rules"]["custom"]:
        assert rule["resources"]["overrides"].keys() == {"namespace", "pod"}
        assert rule["name"]["as"] == "${1}" and "<<.LabelMatchers>>" in rule["metricsQuery"]
        served.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0))
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in served
