"""KubeRay manifests: serveConfigV2 mirrors serve_config.yaml and validates against Serve's schema."""

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / "k8s" / name).read_text())


def test_serve_config_v2_is_serve_config_yaml():
    service = _load("rayservice.yaml")
    in_cluster = yaml.safe_load(service["spec"]["serveConfigV2"])
    local = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    # The only differences allowed: a pod's proxy listens on all interfaces, a laptop's on loopback; and listening
    # beyond the pod, the ingress requires a token, which every pod (the app may be built on any) reads from a Secret.
    assert local["http_options"]["host"] == "127.0.0.1"
    assert in_cluster["http_options"]["host"] == "0.0.0.0"
    in_cluster["http_options"]["host"] = local["http_options"]["host"]
    env_name = in_cluster["applications"][0]["args"].pop("api_key_env")
    assert in_cluster == local
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:
        [container] = pod["template"]["spec"]["containers"]
        [env] = [e for e in container.get("env", []) if e["name"] == env_name]
        assert env["valueFrom"]["secretKeyRef"] == {"name": "tandem-api-key", "key": "token"}, container["name"]


def test_serve_configs_validate_against_serve_schema():
    from ray.serve.schema import ServeDeploySchema

    service = _load("rayservice.yaml")
    for config in (yaml.safe_load(service["spec"]["serveConfigV2"]),
                   yaml.safe_load((ROOT / "serve_config.yaml").read_text())):
        schema = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") \
            else ServeDeploySchema.parse_obj(config)
        assert schema.applications[0].import_path == "apps.rollout:build_app"


def _check_cluster_spec(spec: dict, where: str) -> None:
    assert spec["rayVersion"] == "2.60.0", where
    head = spec["headGroupSpec"]
    assert "rayStartParams" in head, where
    assert head["template"]["spec"]["containers"][0]["image"], where
    groups = spec["workerGroupSpecs"]
    assert groups, where
    for group in groups:
        assert group["groupName"] and "rayStartParams" in group, where
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" in limits, f"{where}: worker group {group['groupName']} has no GPU"


def test_rayservice_required_fields():
    service = _load("rayservice.yaml")
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    assert service["metadata"]["name"]
    _check_cluster_spec(service["spec"]["rayClusterConfig"], "RayService")


def test_rayjob_required_fields_and_entrypoint():
    job = _load("rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["entrypoint"].startswith("python -m apps.train --config configs/")
    config = job["spec"]["entrypoint"].split("--config ")[1].split()[0]
    assert (ROOT / config).is_file()
    _check_cluster_spec(job["spec"]["rayClusterSpec"], "RayJob")


def test_rayjob_places_each_role_on_a_worker_group_and_assumes_no_shared_disk():
    """The entrypoint's overrides load; every resource a role's placement asks for is declared by a worker group's
    rayStartParams; checkpoints and tracking are URIs every pod reaches (the run refuses node-local ones)."""
    import json
    import shlex

    from configs import load_config

    job = _load("rayjob.yaml")
    words = shlex.split(job["spec"]["entrypoint"])
    config, overrides = words[words.index("--config") + 1], [w for w in words if "=" in w and not w.startswith("-")]
    cfg = load_config(str(ROOT / config), overrides)
    declared = {}
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        resources = group["rayStartParams"].get("resources")
        if resources:  # KubeRay passes the value to `ray start --resources=` as written: a quoted JSON string
            declared[group["groupName"]] = json.loads(json.loads(resources))
    placements = {"rollout replicas": cfg.serve.placement, "train workers": cfg.trainer.placement,
                  "agent workers": cfg.actor_rollout_ref.rollout.agent.placement}
    for role, placement in placements.items():
        assert placement.resources, f"{role}: not placed"
        groups = [g for g, have in declared.items() if all(have.get(k, 0) >= v for k, v in placement.resources.items())]
        assert groups, f"{role}: no worker group declares {placement.resources} (declared: {declared})"
    # the resource plan the run checks at start fits the cluster the manifest asks for
    from orchestration.driver import resource_plan

    spec = job["spec"]["rayClusterSpec"]
    head_limits = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    have = {"CPU": float(head_limits["cpu"]), "GPU": float(spec["headGroupSpec"]["rayStartParams"].get("num-gpus", 0))}
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        pod = {"CPU": float(limits["cpu"]), "GPU": float(limits.get("nvidia.com/gpu", 0)), **declared.get(group["groupName"], {})}
        for kind, amount in pod.items():
            have[kind] = have.get(kind, 0.0) + group["replicas"] * amount
    plan = resource_plan(cfg, deploy_rollout=True)
    for kind in {k for part in plan.values() for k in part}:
        asked = sum(part.get(kind, 0.0) for part in plan.values())
        assert asked <= have.get(kind, 0.0), f"{kind}: the run asks {asked}, the manifest's cluster has {have.get(kind)}"
    assert cfg.trainer.storage_path.startswith(("s3://", "gs://", "file://"))
    assert cfg.tracking.mlflow_tracking_uri.startswith("http")
    for volume_key in ("volumes", "volumeMounts"):
        assert volume_key not in json.dumps(job), "the job must not assume a shared volume"
