"""deploy/kubernetes/stage.pytorchjob.yaml against the Kubeflow training operator's CRD schema (vendored:
tests/cluster/kubeflow/README.md) under the API server's strict field validation (``kubectl apply``'s default
``--validate=strict``: an unknown field is refused, not pruned), and against what the operator and the project
expect of it: the replica types it knows, the container and port it reads the rendezvous from, one process per GPU,
the command every machine runs and the image recipe it names."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tasks.cluster_stage import arguments
from vgrpo.parallel.schedulers import RENDEZVOUS_VARIABLES

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "kubernetes" / "stage.pytorchjob.yaml"
CRD = Path(__file__).resolve().parent / "kubeflow" / "pytorchjob-v1.schema.json"


def strict(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others, as the API server's strict field
    validation treats them (``x-kubernetes-preserve-unknown-fields`` keeps an object open)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {k: strict(v) for k, v in schema.items()}
    open_to_others = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_to_others:
        closed["additionalProperties"] = False
    return closed


def crd_errors(manifest: dict[str, Any]) -> list[str]:
    crd = json.loads(CRD.read_text())
    validator = jsonschema.Draft4Validator(strict(crd["openAPIV3Schema"]))  # OpenAPI 3.0's schemas are draft 4's
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    if manifest.get("apiVersion") != f"{crd['group']}/{crd['version']}" or manifest.get("kind") != crd["kind"]:
        errors.append(f"apiVersion/kind {manifest.get('apiVersion')}/{manifest.get('kind')} is not the CRD's")
    name = manifest.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):  # the pods' service names derive from it
        errors.append(f"metadata/name {name!r} is not a DNS label")
    return errors


def load() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())  # the Worker's template is the Master's (a YAML alias)


def test_the_manifest_is_a_valid_pytorchjob() -> None:
    assert crd_errors(load()) == []


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("spec", "pytorchReplicaSpecs", "Worker", "replica"), 1, "'replica' was unexpected"),
        (("spec", "nprocPerNode"), 8, "spec/nprocPerNode"),  # a string in v1.9
        (("spec", "runPolicy", "backoffLimit"), "6", "spec/runPolicy/backoffLimit"),
        (("metadata", "name"), "vgrpo_stage", "DNS label"),
    ],
)
def test_the_schema_check_refuses_a_wrong_field(path: tuple[str, ...], value: object, named: str) -> None:
    manifest = copy.deepcopy(load())
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    assert any(named in error for error in crd_errors(manifest)), crd_errors(manifest)


def test_the_pods_are_what_the_operator_and_the_launcher_expect() -> None:
    spec = load()["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    assert "elasticPolicy" not in spec  # a stage runs on fixed machines
    for replica in replicas.values():
        pod = replica["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
        assert [p["name"] for p in container["ports"]] == ["pytorchjob-port"]
        assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == spec["nprocPerNode"]
        assert not {e["name"] for e in container.get("env", [])} & set(RENDEZVOUS_VARIABLES)  # the operator's
        assert container["command"] == ["python", "-m", "tasks.cluster_stage"]
        args = arguments().parse_args(container["args"])
        assert (REPO / args.curriculum).is_file()
        stages = yaml.safe_load((REPO / args.curriculum).read_text())["curriculum"]["stages"]
        assert 1 <= args.stage <= len(stages)
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert f"{container['workingDir']}/runs" in mounted
        assert replica["restartPolicy"] == "OnFailure"  # a lost pod comes back and the stage resumes


def test_the_image_recipe_the_manifest_names_builds_the_working_dir() -> None:
    manifest = load()
    dockerfile = REPO / manifest["metadata"]["annotations"]["vgrpo/dockerfile"]
    lines = dockerfile.read_text().splitlines()
    workdir = [line.split()[1] for line in lines if line.startswith("WORKDIR ")]
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert workdir == [pod["containers"][0]["workingDir"]]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users == ["vgrpo"] and pod["securityContext"]["runAsUser"] == 1000
    assert (dockerfile.parent / f"{dockerfile.name}.dockerignore").is_file()
