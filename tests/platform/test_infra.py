"""infra/ files parse and hold what the platform relies on: KubeRay specs with GPU workers, compose services,
Dockerfile sources that exist, and an env-var table that covers the variables the code reads."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"


def _load(name: str) -> dict:
    return yaml.safe_load((INFRA / name).read_text())


def _ray_containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def _check_ray_cluster_spec(spec: dict) -> None:
    head = spec["headGroupSpec"]
    assert _ray_containers(head) and "rayStartParams" in head
    for container in _ray_containers(head):
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {}), "head must be CPU-only"
    assert spec["authOptions"] == {"mode": "token"}
    workers = spec["workerGroupSpecs"]
    assert workers
    for group in workers:
        assert group["groupName"] and group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        for container in _ray_containers(group):
            limits = container["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1
            assert container["resources"]["requests"]["nvidia.com/gpu"] == limits["nvidia.com/gpu"]
            assert container["image"]


@pytest.mark.parametrize("name,kind", [("k8s/raycluster.yaml", "RayCluster"), ("k8s/rayjob.yaml", "RayJob")])
def test_kuberay_manifests(name, kind):
    doc = _load(name)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == kind and doc["metadata"]["name"]
    spec = doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterSpec"]
    _check_ray_cluster_spec(spec)
    if kind == "RayJob":
        assert doc["spec"]["entrypoint"].startswith("afm ")
        assert doc["spec"]["shutdownAfterJobFinishes"] is True


def test_configmap_names_service_endpoints():
    doc = _load("k8s/platform-env.yaml")
    assert doc["kind"] == "ConfigMap"
    assert {"MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL", "PREFECT_API_URL", "AFM_STORE_URI"} <= set(doc["data"])
    for name in ("raycluster.yaml", "rayjob.yaml"):
        assert "configMapRef: {name: " + doc["metadata"]["name"] + "}" in (INFRA / "k8s" / name).read_text()


def test_compose_services_ports_and_dependencies():
    services = _load("docker-compose.yml")["services"]
    assert set(services) == {"prefect-db", "prefect", "mlflow-db", "minio", "minio-init", "mlflow"}
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    assert services["prefect"]["depends_on"]["prefect-db"]["condition"] == "service_healthy"
    assert services["mlflow"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    assert "prefect-db:5432" in services["prefect"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    mlflow_cmd = services["mlflow"]["command"]
    assert mlflow_cmd[mlflow_cmd.index("--artifacts-destination") + 1] == "s3://afm/mlflow"
    assert "mlflow-db:5432" in mlflow_cmd[mlflow_cmd.index("--backend-store-uri") + 1]
    assert services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert (INFRA / services["mlflow"]["build"]["dockerfile"]).is_file()
    # No secret literals: passwords come from infra/.env.
    for service in services.values():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET", key):
                assert str(value).startswith("${"), f"{key} must come from the env file"


@pytest.mark.parametrize("dockerfile,context", [("Dockerfile.worker", REPO), ("Dockerfile.mlflow", INFRA)])
def test_dockerfile_copy_sources_exist(dockerfile, context):
    text = (INFRA / dockerfile).read_text()
    assert re.search(r"^FROM \S+", text, re.MULTILINE)
    for line in re.findall(r"^(?:COPY|ADD) (.+)$", text, re.MULTILINE):
        sources = [part for part in line.split()[:-1] if not part.startswith("--")]
        for source in sources:
            assert (context / source).exists(), f"{dockerfile}: COPY source {source} missing from {context}"


def _packages() -> list[str]:
    """The project's top-level packages, as pyproject's setuptools `include` list names them."""
    section = (REPO / "pyproject.toml").read_text().split("[tool.setuptools.packages.find]")[1]
    return re.findall(r'"(\w+)\*"', section)


def test_worker_image_copies_every_package():
    text = (INFRA / "Dockerfile.worker").read_text()
    for package in _packages():
        assert f"COPY {package} ./{package}" in text, f"Dockerfile.worker does not copy package {package}"


def test_readme_env_table_covers_variables_read_in_code():
    table = (INFRA / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)`", table, re.MULTILINE)) | set(
        re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    read_in_code = set()
    for path in (path for package in _packages() for path in (REPO / package).rglob("*.py")):
        text = path.read_text(errors="replace")
        read_in_code |= set(re.findall(r"environ(?:\.get)?[(\[]\s*\"([A-Z][A-Z0-9_]+)\"", text))
        read_in_code |= set(re.findall(r"api_key_env\w*: str = Field\(\"([A-Z][A-Z0-9_]+)\"", text))
        read_in_code |= set(re.findall(r"api_key_env: str = \"([A-Z][A-Z0-9_]+)\"", text))
    assert {"AFM_HOME", "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL"} <= read_in_code, "the scan is broken"
    assert read_in_code <= documented, f"undocumented env vars: {sorted(read_in_code - documented)}"
