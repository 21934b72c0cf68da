"""Where each model is served: the upstream config file and the replica pool.

The file (INFERMETER_UPSTREAMS, YAML) lists every model the gateway serves, the deployment it
belongs to (metering rolls usage up by deployment) and its vLLM replicas:

    models:
      - name: tiny-llama            # the model name clients send
        deployment_id: tiny-cpu     # carried on every request event
        upstream_model: tiny-llama  # the name vLLM serves it under (default: name)
        routing: prefix             # prefix | round_robin (default: INFERMETER_ROUTING)
        replicas:
          - id: tiny-cpu-0
            url: http://127.0.0.1:8000
          - id: tiny-cpu-1
            url: http://127.0.0.1:8001

A replica that refuses connections is marked down for `down_for_s` seconds and skipped while
another replica is up; a model whose replicas are all down still tries the least recently failed
one, so recovery needs no restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROUTING_POLICIES = ("prefix", "round_robin")


class UpstreamConfigError(ValueError):
    """The upstream file is missing or malformed (the message names the file and the problem)."""


@dataclass
class Replica:
    replica_id: str
    url: str  # base URL without /v1
    in_flight: int = 0
    down_until: float = 0.0
    failures: int = 0

    def is_up(self, now: float) -> bool:
        return self.down_until <= now


@dataclass
class ModelRoute:
    name: str
    deployment_id: str
    upstream_model: str
    routing: str
    replicas: list[Replica]
    down_for_s: float = 5.0
    _next: int = field(default=0, repr=False)

    def mark_down(self, replica: Replica, now: float | None = None) -> None:
        replica.failures += 1
        replica.down_until = (time.monotonic() if now is None else now) + self.down_for_s

    def mark_up(self, replica: Replica) -> None:
        replica.down_until = 0.0


@dataclass
class UpstreamConfig:
    models: dict[str, ModelRoute]

    def route(self, model: str) -> ModelRoute | None:
        return self.models.get(model)


def _fail(source: str, problem: str) -> UpstreamConfigError:
    return UpstreamConfigError(f"{source}: {problem}")


def parse_upstreams(
    raw: object, *, default_routing: str = "prefix", source: str = "upstreams"
) -> UpstreamConfig:
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), list) or not raw["models"]:
        raise _fail(source, "expected a mapping with a non-empty 'models' list")
    models: dict[str, ModelRoute] = {}
    replica_ids: set[str] = set()
    for index, entry in enumerate(raw["models"]):
        where = f"models[{index}]"
        if not isinstance(entry, dict):
            raise _fail(source, f"{where} must be a mapping")
        name = entry.get("name")
        deployment_id = entry.get("deployment_id")
        if not isinstance(name, str) or not name:
            raise _fail(source, f"{where}.name must be a non-empty string")
        if name in models:
            raise _fail(source, f"model {name!r} is listed twice")
        if not isinstance(deployment_id, str) or not deployment_id:
            raise _fail(source, f"{where}.deployment_id must be a non-empty string")
        routing = entry.get("routing", default_routing)
        if routing not in ROUTING_POLICIES:
            raise _fail(
                source, f"{where}.routing must be one of {', '.join(ROUTING_POLICIES)}, not {routing!r}"
            )
        replicas_raw = entry.get("replicas")
        if not isinstance(replicas_raw, list) or not replicas_raw:
            raise _fail(source, f"{where}.replicas must be a non-empty list")
        replicas = []
        for r_index, rep in enumerate(replicas_raw):
            r_where = f"{where}.replicas[{r_index}]"
            if (
                not isinstance(rep, dict)
                or not isinstance(rep.get("url"), str)
                or not rep["url"].startswith("http")
            ):
                raise _fail(source, f"{r_where} needs a url starting with http:// or https://")
            replica_id = rep.get("id") or f"{deployment_id}-{r_index}"
            if replica_id in replica_ids:
                raise _fail(source, f"replica id {replica_id!r} is used twice")
            replica_ids.add(replica_id)
            url = rep["url"].rstrip("/")
            if url.endswith("/v1"):
                url = url[: -len("/v1")]
            replicas.append(Replica(replica_id=str(replica_id), url=url))
        models[name] = ModelRoute(
            name=name,
            deployment_id=deployment_id,
            upstream_model=str(entry.get("upstream_model") or name),
            routing=routing,
            replicas=replicas,
            down_for_s=float(entry.get("down_for_s", 5.0)),
        )
    return UpstreamConfig(models=models)


def load_upstreams(path: Path, *, default_routing: str = "prefix") -> UpstreamConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UpstreamConfigError(f"upstream file {path} does not exist (set INFERMETER_UPSTREAMS)") from None
    except (OSError, yaml.YAMLError) as exc:
        raise UpstreamConfigError(f"cannot read upstream file {path}: {exc}") from None
    return parse_upstreams(raw, default_routing=default_routing, source=str(path))


def single_upstream(
    model: str, url: str, *, deployment_id: str | None = None, routing: str = "prefix"
) -> UpstreamConfig:
    """A one-replica config (for `--upstream URL` options and tests)."""
    return parse_upstreams(
        {"models": [{"name": model, "deployment_id": deployment_id or model, "replicas": [{"url": url}]}]},
        default_routing=routing,
    )
