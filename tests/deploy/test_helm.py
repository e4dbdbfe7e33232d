"""The Helm chart (deploy/helm/lowtide), rendered by Helm itself (the helm-python-sdk's native
library: no helm binary, no cluster) with its default values and with others, every object
checked against the Kubernetes schemas (kubernetes-validate, offline), and what a user relies on
checked as the cluster would read it: the Services and budgets select the pods they mean, the
probes ask gRPC health, the environment names only real settings, the configuration loads, and
KEDA scales the workers on the scheduler."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from lowtide.config import OTHER_VARIABLES, config_variables, load_config
from lowtide.health import check_health
from tests.deploy.compose import REPO
from tests.helpers import eventually, free_port

CHART = REPO / "deploy" / "helm" / "lowtide"
RELEASE, NAMESPACE = "prod", "queues"
# The oldest Kubernetes the chart says it supports (Chart.yaml kubeVersion) and the newest schemas.
VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())
TOKENS = (
    '[[auth.tokens]]\nname = "ops"\nrole = "admin"\n'
    'sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"\n'
)
# What an install must give: its database, and the tokens auth (on by default) accepts.
REQUIRED = {"database": {"existingSecret": "lowtide-database"}, "config": {"toml": TOKENS}}
EVERYTHING = {
    **REQUIRED,
    "scheduler": {"replicas": 3},
    "signal": {"replicas": 2, "feed": "uk-carbon-intensity"},
    "tls": {"enabled": True, "secretName": "lowtide-tls", "mutual": True},
    "auth": {"signalToken": {"secretName": "lowtide-signal-token"}},
    "workers": {
        "enabled": True,
        "pool": "batch",
        "queues": ["default", "nightly"],
        "slots": 32,
        "tokenSecret": {"secretName": "lowtide-worker-token"},
    },
    "keda": {"enabled": True, "maxReplicas": 50},
    "config": {"toml": '[cost]\ndeferrable_activities = ["train"]\n\n[pools.batch]\nmax_workers = 50\n\n' + TOKENS},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    return [
        obj for path, text in manifests.items() if path.endswith(".yaml") for obj in yaml.safe_load_all(text) if obj
    ]


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, deployment in of_kind(objects, "Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield name, container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.fixture(scope="module", params=["defaults", "everything"])
def rendered(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    values = REQUIRED if request.param == "defaults" else EVERYTHING
    return values, render(values)


def test_every_object_is_valid_against_the_kubernetes_schemas(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    assert {"Deployment", "Service", "PodDisruptionBudget", "Secret"} <= {o["kind"] for o in objects}
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # KEDA's own kinds: checked below, against what KEDA reads
        for version in VERSIONS:
            # strict: a field the schema does not know (a typo, a misplaced key) fails too.
            kubernetes_validate.validate(obj, version, strict=True)


def test_a_broken_object_fails_the_schema_check() -> None:
    deployment = of_kind(render(REQUIRED), "Deployment")[f"{RELEASE}-lowtide-scheduler"]
    kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    deployment["spec"]["replica"] = 2  # a typo of a field: the cluster would refuse it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_services_and_budgets_select_the_pods_they_mean(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    deployments = of_kind(objects, "Deployment")
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    for name, service in of_kind(objects, "Service").items():
        selector = service["spec"]["selector"]
        chosen = [d for d, labels in pods.items() if selector.items() <= labels.items()]
        assert chosen == [name], (name, chosen)
        ports = {p["name"] for _, c in containers(objects) if _ == name for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name
    for name, budget in of_kind(objects, "PodDisruptionBudget").items():
        selector = budget["spec"]["selector"]["matchLabels"]
        assert [d for d, labels in pods.items() if selector.items() <= labels.items()] == [name]
    for name, deployment in deployments.items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pods[name].items(), name


def test_the_scheduler_runs_its_replicas_and_keeps_one_up_in_a_drain(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    values, objects = rendered
    scheduler = of_kind(objects, "Deployment")[f"{RELEASE}-lowtide-scheduler"]
    assert scheduler["spec"]["replicas"] == values.get("scheduler", {}).get("replicas", 2)
    budget = of_kind(objects, "PodDisruptionBudget")[f"{RELEASE}-lowtide-scheduler"]
    assert budget["spec"]["maxUnavailable"] == 1


def test_probes_ask_grpc_health_through_tls_when_it_is_on(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    values, objects = rendered
    tls = values.get("tls", {}).get("enabled", False)
    ports = {"scheduler": 50051, "signal": 50052}
    for name, container in containers(objects):
        component = name.rsplit("-", 1)[-1]
        if component not in ports:
            continue
        probe = container["readinessProbe"]
        if tls:
            # Kubernetes' gRPC probe speaks plaintext only: `lowtide health` reads LOWTIDE_CA.
            assert probe["exec"]["command"] == ["lowtide", "health", "--target", f"localhost:{ports[component]}"]
            assert env_of(container)["LOWTIDE_CA"] == "/etc/lowtide/tls/ca.crt"
        else:
            assert probe["grpc"] == {"port": ports[component]}
        assert container["startupProbe"].keys() & {"grpc", "exec"}


def test_the_environment_names_only_real_settings_and_the_configuration_loads(
    rendered: tuple[dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    values, objects = rendered
    known = config_variables() | OTHER_VARIABLES
    secret = next(iter(of_kind(objects, "Secret").values()))
    config = tmp_path / "lowtide.toml"
    config.write_text(secret["stringData"]["lowtide.toml"])
    for name, container in containers(objects):
        env = env_of(container)
        unknown = {v for v in env if v.startswith("LOWTIDE_") and v not in known}
        assert not unknown, (name, unknown)
        assert env["LOWTIDE_CONFIG"] == "/etc/lowtide/config/lowtide.toml"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/etc/lowtide/config"] == "config"
        # What the service reads: the file, with the literal variables over it.
        plain = {k: v for k, v in env.items() if isinstance(v, str) and k != "LOWTIDE_CONFIG"}
        loaded = load_config(config, env=plain)
        if name.endswith("-scheduler"):
            assert loaded.scheduler.listen == "0.0.0.0:50051"
            assert loaded.scheduler.signal_target == f"{RELEASE}-lowtide-signal.{NAMESPACE}.svc.cluster.local:50052"
            database = env["LOWTIDE_DATABASE_URL"]["secretKeyRef"]
            assert database == {"name": "lowtide-database", "key": "url"}
        if "tls" in values:
            assert loaded.tls.cert == "/etc/lowtide/tls/tls.crt" or not name.endswith(("-scheduler", "-signal"))
            assert mounts["/etc/lowtide/tls"] == "tls"
            # Mutual TLS at the scheduler only: the scheduler's own Subscribe to the signal service
            # presents no certificate, so demanding one there would cut every cost hold off.
            demands = bool(loaded.tls.client_ca)
            assert demands == name.endswith("-scheduler"), name


def test_keda_scales_the_workers_on_the_scheduler() -> None:
    objects = render(EVERYTHING)
    workers = of_kind(objects, "Deployment")[f"{RELEASE}-lowtide-worker"]
    # KEDA owns the replica count: the Deployment must not fight it on every upgrade.
    assert "replicas" not in workers["spec"]
    scaled = of_kind(objects, "ScaledObject")[f"{RELEASE}-lowtide-worker"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"] == {"name": workers["metadata"]["name"]}
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 50)
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "external"
    scheduler = of_kind(objects, "Service")[f"{RELEASE}-lowtide-scheduler"]
    assert trigger["metadata"] == {
        "scalerAddress": f"{scheduler['metadata']['name']}.{NAMESPACE}.svc.cluster.local:50051",
        "pool": "batch",
        "queues": "default,nightly",
        "slotsPerWorker": "32",
    }
    # Under TLS KEDA gets the CA and, for mutual TLS, the client certificate from the Secret.
    auth = of_kind(objects, "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    parameters = {ref["parameter"]: (ref["name"], ref["key"]) for ref in auth["spec"]["secretTargetRef"]}
    assert parameters == {
        "caCert": ("lowtide-tls", "ca.crt"),
        "tlsClientCert": ("lowtide-tls", "tls.crt"),
        "tlsClientKey": ("lowtide-tls", "tls.key"),
    }
    (container,) = workers["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["LOWTIDE_TOKEN"] == {"secretKeyRef": {"name": "lowtide-worker-token", "key": "token"}}


def test_without_a_database_tokens_or_workers_for_keda_the_chart_says_what_to_set() -> None:
    with pytest.raises(helm.HelmError, match=r"database\.existingSecret"):
        render({"config": {"toml": TOKENS}})
    with pytest.raises(helm.HelmError, match=r"no \[\[auth\.tokens\]\]"):
        render({"database": REQUIRED["database"]})
    # Off, or in a Secret of the user's own, the chart has nothing to check.
    render({"database": REQUIRED["database"], "auth": {"enabled": False}})
    render({"database": REQUIRED["database"], "config": {"existingSecret": "my-lowtide-config"}})
    with pytest.raises(helm.HelmError, match=r"workers\.enabled"):
        render({**REQUIRED, "keda": {"enabled": True}})


def test_helm_lint_finds_nothing_to_warn_about() -> None:
    for values in (REQUIRED, EVERYTHING):
        report = helm.lint(CHART, values=values, strict=True, kube_version="v1.27.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert (report["errors"], problems) == ([], [])


async def test_the_rendered_services_serve_as_local_processes(database_url: str, tmp_path: Path) -> None:
    # Each lowtide container's own arguments and environment, run as a local process (no
    # cluster here), with only what a cluster provides mapped: the mounted configuration, the
    # database Secret, the Services' names and the pods' ports. Both must answer the gRPC health
    # check their readiness probe asks, on the port it asks.
    objects = render({**REQUIRED, "auth": {"enabled": False}})
    secret = next(iter(of_kind(objects, "Secret").values()))
    config = tmp_path / "lowtide.toml"
    config.write_text(secret["stringData"]["lowtide.toml"])
    ports = {50051: free_port(), 50052: free_port(), 9464: free_port(), 9465: free_port()}
    signal_target = f"{RELEASE}-lowtide-signal.{NAMESPACE}.svc.cluster.local:50052"

    def local(value: Any) -> str:
        if isinstance(value, dict):
            assert value["secretKeyRef"]["name"] == "lowtide-database"
            return database_url
        text = str(value).replace(signal_target, "0.0.0.0:50052")
        for port, mapped in ports.items():
            text = text.replace(f"0.0.0.0:{port}", f"127.0.0.1:{mapped}")
        return text.replace("/etc/lowtide/config/lowtide.toml", str(config))

    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOWTIDE_", "OTEL_"))}
    started: list[tuple[str, asyncio.subprocess.Process, int]] = []
    try:
        for component in ("signal", "scheduler"):
            (container,) = of_kind(objects, "Deployment")[f"{RELEASE}-lowtide-{component}"]["spec"]["template"]["spec"][
                "containers"
            ]
            env = {**base, **{name: local(value) for name, value in env_of(container).items()}}
            log = (tmp_path / f"{component}.log").open("wb")
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "lowtide", *container["args"], env=env, stdout=log, stderr=log
            )
            started.append((component, process, ports[container["readinessProbe"]["grpc"]["port"]]))
        for component, _, port in started:

            async def serving(port: int = port) -> bool:
                return (await check_health(f"127.0.0.1:{port}", within=2.0)).serving

            try:
                await eventually(serving, within=60, interval=0.5)
            except AssertionError:
                raise AssertionError((tmp_path / f"{component}.log").read_text()[-3000:]) from None
    finally:
        for _, process, _ in started:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for _, process, _ in started:
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()
