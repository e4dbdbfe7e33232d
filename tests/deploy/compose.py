"""Reads docker-compose.yml and turns a lowtide service into the local process it stands for:
its own command and environment, with the compose network's host names (postgres, signal,
scheduler) and ports mapped to 127.0.0.1 and free ports, consistently across services."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
# Compose's `${NAME:-default}` interpolation, as `docker compose` does it with NAME unset.
_DEFAULTED = re.compile(r"\$\{(\w+):?-([^}]*)\}")
# A host:port inside the compose network (or a wildcard listen) that must be mapped here; the
# collector's is where tests stand a local OTLP receiver.
_ADDRESS = re.compile(r"\b(0\.0\.0\.0|127\.0\.0\.1|signal|scheduler|otel-collector):(\d+)\b")


def interpolate(value: str) -> str:
    """`${NAME:-default}` as `docker compose` reads it in the current environment."""
    return _DEFAULTED.sub(lambda m: os.environ.get(m.group(1)) or m.group(2), value)


def published(service: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) for each of a service's `ports` entries, in
    compose's short syntax; an entry without an address is published on every interface."""
    entries = []
    for entry in service.get("ports") or []:
        parts = interpolate(str(entry)).split(":")
        address = parts[0] if len(parts) == 3 else "0.0.0.0"
        entries.append((address, int(parts[-2]), int(parts[-1])))
    return entries


def load_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


@dataclass
class PortMap:
    """One free local port per compose port (50051, 9464, ...), the same for every service."""

    database_url: str
    ports: dict[int, int] = field(default_factory=dict)

    def local(self, port: int) -> int:
        if port not in self.ports:
            self.ports[port] = free_port()
        return self.ports[port]

    def rewrite(self, value: str) -> str:
        value = interpolate(value)
        if "@postgres:5432/" in value:
            return self.database_url
        return _ADDRESS.sub(lambda m: f"127.0.0.1:{self.local(int(m.group(2)))}", value)


@dataclass(frozen=True)
class LocalService:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    health: list[str] | None


def _command(service: Mapping[str, Any]) -> list[str]:
    command = service["command"]
    assert isinstance(command, list), "commands in docker-compose.yml are exec-form lists"
    return [str(part) for part in command]


def local_service(name: str, service: Mapping[str, Any], ports: PortMap) -> LocalService:
    """The process `docker compose up` would run for `name`, here. lowtide images run `lowtide`
    (their entry point); the Node worker's image runs its command in clients/node."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    env.update({str(k): ports.rewrite(str(v)) for k, v in (service.get("environment") or {}).items()})
    command = [ports.rewrite(part) for part in _command(service)]
    build = service.get("build")
    if build == ".":
        argv, cwd = [sys.executable, "-m", "lowtide", *command], REPO
    else:
        assert isinstance(build, Mapping), f"{name}: build is . or a context with a dockerfile"
        cwd = (REPO / str(build["dockerfile"])).parent
        argv = command
    health = None
    check = (service.get("healthcheck") or {}).get("test")
    if isinstance(check, list) and check[:2] == ["CMD", "lowtide"]:
        health = [sys.executable, "-m", "lowtide", *(ports.rewrite(str(part)) for part in check[2:])]
    return LocalService(name, argv, env, cwd, health)


def start_order(services: Mapping[str, Any], names: list[str]) -> list[str]:
    """`names` ordered so that each comes after what it depends_on (among `names`)."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered or name not in names:
            return
        for dependency in services[name].get("depends_on") or {}:
            visit(str(dependency))
        ordered.append(name)

    for name in names:
        visit(name)
    return ordered
