"""The deployment files are valid before anyone deploys them: every Kubernetes object of
`infra/deploy/k8s/` against the Kubernetes schemas `kubernetes-validate` ships (strict: an unknown
field fails), and `infra/deploy/compose.yaml` as a real compose implementation reads it
(`docker-compose config`, from Debian's package, installed by `make setup`). KEDA's ScaledObject is
a custom resource whose schema is not shipped offline: its references are checked instead (each
scales a Deployment of the same files, on a tier queue that exists)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from adaptive_rag.contracts import QUEUE_FOR_TIER
from infra.local.llama_server import MODEL_ALIAS, PARITY_ARGS

DEPLOY = Path(__file__).resolve().parents[2] / "infra" / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
# The oldest Kubernetes minor the manifests promise to run on (infra/deploy/README.md).
KUBERNETES_VERSION = "1.29"


def _objects() -> list[tuple[str, dict]]:
    return [(f"{path.name}#{i}", doc) for path in MANIFESTS
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if doc]


OBJECTS = _objects()
CORE = [(name, doc) for name, doc in OBJECTS if not doc["apiVersion"].startswith("keda.sh/")]
SCALED = [(name, doc) for name, doc in OBJECTS if doc["apiVersion"].startswith("keda.sh/")]


def test_every_manifest_file_is_read() -> None:
    assert {p.name for p in MANIFESTS} >= {"frontdoor.yaml", "workers.yaml", "triton.yaml", "retrain.yaml"}
    assert len(CORE) >= 6 and len(SCALED) == 3


@pytest.mark.parametrize(("name", "doc"), CORE, ids=[name for name, _ in CORE])
def test_kubernetes_objects_match_the_schemas(name: str, doc: dict) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The check can fail: a misspelt field of a Deployment is refused."""
    name, deployment = next((n, d) for n, d in CORE if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replica"] = broken["spec"].pop("replicas", 1)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_scaled_objects_scale_existing_deployments_on_tier_queues() -> None:
    deployments = {d["metadata"]["name"] for _, d in CORE if d["kind"] == "Deployment"}
    for name, doc in SCALED:
        assert doc["kind"] == "ScaledObject", name
        assert doc["spec"]["scaleTargetRef"]["name"] in deployments, name
        triggers = doc["spec"]["triggers"]
        assert triggers and all(t["type"] == "redis" for t in triggers), name
        assert {t["metadata"]["listName"] for t in triggers} <= set(QUEUE_FOR_TIER.values()), name


def test_compose_file_is_read_by_docker_compose(tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (Debian package) is installed by `make setup`"
    env = dict(os.environ)
    done = subprocess.run([compose, "-f", str(DEPLOY / "compose.yaml"), "config", "-q"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def compose_config(tmp_path: Path, **env: str) -> dict:
    """The compose file as docker-compose resolves it, with `env` (and no LLM_* of this process)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLM_")}
    done = subprocess.run(["docker-compose", "-f", str(DEPLOY / "compose.yaml"), "config"],
                          capture_output=True, text=True, env={**base, **env}, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_without_an_llm_endpoint_the_pools_use_the_stacks_own_llama_server(tmp_path: Path) -> None:
    config = compose_config(tmp_path)
    llm = config["services"]["llm"]
    assert llm["build"]["target"] == "llm-server" and "--parallel" in llm["command"]
    for name, service in config["services"].items():
        if name.startswith("worker-"):
            env = service["environment"]
            assert (env["LLM_BASE_URL"], env["LLM_MODEL"], env["LLM_API"]) == (
                "http://llm:8080/v1", MODEL_ALIAS, "completions"), name
    elsewhere = compose_config(tmp_path, LLM_BASE_URL="http://vllm:8000/v1", LLM_API="chat")
    assert elsewhere["services"]["worker-c"]["environment"]["LLM_BASE_URL"] == "http://vllm:8000/v1"
    assert elsewhere["services"]["worker-c"]["environment"]["LLM_API"] == "chat"


def test_the_llm_image_runs_llama_server_as_the_local_stack_does() -> None:
    """The container's flags are the local launcher's (`infra.local.llama_server`): the model's
    alias the pools name and the flags that keep the embedded model's numerics."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    stage = dockerfile[dockerfile.index("AS llm-server"):]
    stage = stage[:stage.index("\nFROM ") if "\nFROM " in stage else len(stage)]
    entrypoint = stage[stage.index("ENTRYPOINT"):stage.index("CMD [")]
    for flag in (*PARITY_ARGS, "--alias", MODEL_ALIAS, "--cont-batching"):
        assert f'"{flag}"' in entrypoint, flag
    [deployment] = [d for _, d in CORE if d["kind"] == "Deployment" and d["metadata"]["name"] == "llm"]
    [service] = [d for _, d in CORE if d["kind"] == "Service" and d["metadata"]["name"] == "llm"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
