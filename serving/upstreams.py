"""Where each model is served: the upstream config file and the replica pool.

The file (INFERMETER_UPSTREAMS, YAML) lists every model the gateway serves, the deployment it
belongs to (metering rolls usage up by deployment) and its vLLM replicas:

    models:
      - name: tiny-llama            # the model name clients send
        deployment_id: tiny-cpu     # carried on every request event
        upstream_model: tiny-llama  # the name vLLM serves it under (default: name)
        routing: prefix             # prefix | round_robin (default: INFERMETER_ROUTING)
        down_for_s: 5               # breaker cool-down (default: INFERMETER_BREAKER_COOLDOWN_S)
        fallback: tiny-llama-big    # optional: another model of this file serves it when none
                                    # of these replicas can (chains allowed, loops refused)
        region: eu-west             # optional: where the deployment's replicas run (data residency)
        replicas:
          - id: tiny-cpu-0
            url: http://127.0.0.1:8000
          - id: tiny-cpu-1
            url: http://127.0.0.1:8001
            region: eu-central      # a replica's own region overrides its model's

Each replica has a circuit breaker, kept in `Replica.down_until` (monotonic seconds):

- closed (`down_until == 0`): routed to normally;
- open (`down_until > now`): a request failed on it (serving/proxy.py: refused, reset, silent,
  5xx or 429) and it is skipped for `down_for_s` seconds (the cool-down);
- half-open (`0 < down_until <= now`): the cool-down is over; the next request routed to it is
  the probe (`claim_probe` re-opens it for another cool-down meanwhile, so exactly one request
  probes at a time). The probe's success closes the breaker (`mark_up`), its failure opens it
  again (`mark_down`).

A model whose replicas (and fallback models' replicas) are all open still tries the one whose
cool-down ends first, so a single-replica model is never refused without trying and recovery
needs no restart. The file is checked at start: a `fallback` naming a model that is not in the
file, or fallbacks that loop (a -> b -> a), are errors; so is a `region` that is not one of
INFERMETER_REGIONS (`check_regions`; serving/residency.py routes restricted customers by region).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROUTING_POLICIES = ("prefix", "round_robin")


class UpstreamConfigError(ValueError):
    """The upstream file is missing or malformed (the message names the file and the problem)."""


DEFAULT_COOLDOWN_S = 5.0
REGION_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")  # the event contract's region (metering/contract.py)


def parse_regions(text: str | Iterable[str] | None, *, what: str = "regions") -> tuple[str, ...]:
    """Regions from a comma-separated string (or a list), de-duplicated and sorted; ValueError
    naming `what` for one that is not a lower-case slug (letters, digits, dashes)."""
    if text is None:
        return ()
    parts = text.split(",") if isinstance(text, str) else list(text)
    regions = sorted({str(part).strip() for part in parts if str(part).strip()})
    bad = [region for region in regions if not REGION_RE.match(region)]
    if bad:
        raise ValueError(
            f"{what}: {', '.join(repr(b) for b in bad)} is not a region name (lower-case letters, digits and dashes)"
        )
    return tuple(regions)


def unknown_regions_error(regions: Iterable[str], known: Iterable[str], *, what: str) -> str | None:
    """The error message when some of `regions` are not `known` (INFERMETER_REGIONS), else None."""
    known = tuple(known)
    unknown = [region for region in regions if region not in known]
    if not unknown:
        return None
    listed = ", ".join(known) if known else "none: INFERMETER_REGIONS is empty"
    return f"{what}: unknown region {', '.join(repr(u) for u in unknown)} (known regions: {listed})"


@dataclass(eq=False)  # compared by identity: its fields change while it serves
class Replica:
    replica_id: str
    url: str  # base URL without /v1
    in_flight: int = 0
    down_until: float = 0.0  # the breaker: 0 closed, > now open, else half-open (see the module doc)
    failures: int = 0
    region: str | None = None  # where it runs (data residency); None: no region

    def is_up(self, now: float) -> bool:
        """Closed, or half-open (its cool-down is over: it may take a probe)."""
        return self.down_until <= now

    def breaker(self, now: float | None = None) -> str:
        """closed | open | half_open (for logs, tests and /metrics)."""
        if not self.down_until:
            return "closed"
        return "open" if self.down_until > (time.monotonic() if now is None else now) else "half_open"


@dataclass(eq=False)
class ModelRoute:
    name: str
    deployment_id: str
    upstream_model: str
    routing: str
    replicas: list[Replica]
    down_for_s: float | None = None  # None: the gateway's INFERMETER_BREAKER_COOLDOWN_S
    fallback: str | None = None  # another model's name (checked: it exists, no loop)
    fallback_route: ModelRoute | None = field(default=None, repr=False)
    _next: int = field(default=0, repr=False)

    @property
    def cooldown_s(self) -> float:
        return DEFAULT_COOLDOWN_S if self.down_for_s is None else self.down_for_s

    def mark_down(self, replica: Replica, now: float | None = None) -> bool:
        """Open the replica's breaker for a cool-down; True if it was closed (a new outage)."""
        was_closed = not replica.down_until
        replica.failures += 1
        replica.down_until = (time.monotonic() if now is None else now) + self.cooldown_s
        return was_closed

    def mark_up(self, replica: Replica) -> None:
        """Close the replica's breaker (a request succeeded on it)."""
        replica.down_until = 0.0

    def claim_probe(self, replica: Replica, now: float | None = None) -> None:
        """A request is about to go to a half-open (or, as a last resort, open) replica: keep every
        other request away until it decides (success closes, failure re-opens; a probe that never
        decides, e.g. cancelled, leaves the breaker to reopen after one more cool-down)."""
        replica.down_until = (time.monotonic() if now is None else now) + self.cooldown_s

    def chain(self) -> list[ModelRoute]:
        """This route and its fallbacks, in order."""
        routes = [self]
        while routes[-1].fallback_route is not None:
            routes.append(routes[-1].fallback_route)
        return routes


@dataclass
class UpstreamConfig:
    models: dict[str, ModelRoute]
    source: str = "upstreams"  # the file it came from (error messages)

    def check_regions(self, known: Iterable[str]) -> None:
        """UpstreamConfigError when a replica names a region that is not `known` (INFERMETER_REGIONS)."""
        known = tuple(known)
        for route in self.models.values():
            for replica in route.replicas:
                if replica.region is not None and (
                    problem := unknown_regions_error(
                        (replica.region,), known, what=f"replica {replica.replica_id!r} of model {route.name!r}"
                    )
                ):
                    raise _fail(self.source, problem)

    def route(self, model: str) -> ModelRoute | None:
        return self.models.get(model)

    def apply_default_cooldown(self, seconds: float) -> None:
        """Give `seconds` as cool-down to every model whose file entry did not set `down_for_s`."""
        for route in self.models.values():
            if route.down_for_s is None:
                route.down_for_s = seconds


def _fail(source: str, problem: str) -> UpstreamConfigError:
    return UpstreamConfigError(f"{source}: {problem}")


def parse_upstreams(  # noqa: C901 - one check per field, in file order
    raw: object,
    *,
    default_routing: str = "prefix",
    source: str = "upstreams",
    breaker_cooldown_s: float | None = None,
    known_regions: Iterable[str] | None = None,
) -> UpstreamConfig:
    """The checked config. `breaker_cooldown_s` is the cool-down of models without `down_for_s`
    (None: left to the gateway, which applies INFERMETER_BREAKER_COOLDOWN_S). With `known_regions`
    (INFERMETER_REGIONS) every region must be one of them; the gateway checks it at start anyway."""
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
        model_region = _region(source, f"{where}.region", entry.get("region"))
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
            region = _region(source, f"{r_where}.region", rep.get("region")) or model_region
            replicas.append(Replica(replica_id=str(replica_id), url=url, region=region))
        down_for_s = entry.get("down_for_s", breaker_cooldown_s)
        if down_for_s is not None and (
            isinstance(down_for_s, bool) or not isinstance(down_for_s, int | float) or down_for_s < 0
        ):
            raise _fail(source, f"{where}.down_for_s must be a number of seconds >= 0, not {down_for_s!r}")
        fallback = entry.get("fallback")
        if fallback is not None and (not isinstance(fallback, str) or not fallback):
            raise _fail(source, f"{where}.fallback must be the name of another model of this file")
        if fallback == name:
            raise _fail(source, f"model {name!r} names itself as its fallback")
        models[name] = ModelRoute(
            name=name,
            deployment_id=deployment_id,
            upstream_model=str(entry.get("upstream_model") or name),
            routing=routing,
            replicas=replicas,
            down_for_s=None if down_for_s is None else float(down_for_s),
            fallback=fallback,
        )
    _link_fallbacks(models, source)
    config = UpstreamConfig(models=models, source=source)
    if known_regions is not None:
        config.check_regions(known_regions)
    return config


def _region(source: str, where: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not REGION_RE.match(value):
        raise _fail(source, f"{where} must be a region name (lower-case letters, digits and dashes), not {value!r}")
    return value


def _link_fallbacks(models: dict[str, ModelRoute], source: str) -> None:
    for route in models.values():
        if route.fallback is None:
            continue
        target = models.get(route.fallback)
        if target is None:
            known = ", ".join(sorted(models))
            raise _fail(
                source,
                f"model {route.name!r} falls back to {route.fallback!r}, which is not in this file ({known})",
            )
        route.fallback_route = target
    for route in models.values():
        path = [route.name]
        current = route.fallback_route
        while current is not None:
            if current.name in path:
                loop = " -> ".join([*path[path.index(current.name) :], current.name])
                raise _fail(source, f"fallback loop: {loop}")
            path.append(current.name)
            current = current.fallback_route


def load_upstreams(
    path: Path,
    *,
    default_routing: str = "prefix",
    breaker_cooldown_s: float | None = None,
    known_regions: Iterable[str] | None = None,
) -> UpstreamConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UpstreamConfigError(f"upstream file {path} does not exist (set INFERMETER_UPSTREAMS)") from None
    except (OSError, yaml.YAMLError) as exc:
        raise UpstreamConfigError(f"cannot read upstream file {path}: {exc}") from None
    return parse_upstreams(
        raw,
        default_routing=default_routing,
        source=str(path),
        breaker_cooldown_s=breaker_cooldown_s,
        known_regions=known_regions,
    )


def single_upstream(
    model: str, url: str, *, deployment_id: str | None = None, routing: str = "prefix"
) -> UpstreamConfig:
    """A one-replica config (for `--upstream URL` options and tests)."""
    return parse_upstreams(
        {"models": [{"name": model, "deployment_id": deployment_id or model, "replicas": [{"url": url}]}]},
        default_routing=routing,
    )
