"""Which replica serves a request: prefix-cache aware, with a load-aware fallback.

vLLM's prefix cache lives per replica. Requests that share a prompt prefix (a system prompt, a
conversation's earlier turns, a RAG document) only hit the cache if they land on the replica that
served the prefix before. So:

- `prefix`: the prompt's first `prefix_chars` characters (about the first few KV blocks) are
  hashed, and replicas are ranked by rendezvous (highest-random-weight) hashing on that key:
  the same prefix always prefers the same replica, and removing a replica only moves the
  prefixes it owned. The preferred replica is skipped when it is down, or when it carries more
  than `max_imbalance` requests beyond the least-loaded live replica (load-aware fallback); the
  next replica in rank order is taken instead, so the fallback itself stays sticky.
- `round_robin`: the baseline the prefix policy is compared with (docs/serving.md).

Failover (serving/proxy.py) asks again with the replicas already tried in `exclude`: under prefix
routing that is the next replica of the same rank order (the next one on the hash ring), so a
prefix whose replica is out keeps landing on one other replica. Replicas whose breaker is open
(serving/upstreams.py) are skipped; with `healthy_only` the answer is None when none is left,
else the replica whose cool-down ends first (never refuse without trying).

Pure: no I/O; `in_flight` counts are kept by the gateway. The rank order of the prefix keys seen
last is kept (`rank_replicas`, bounded): a prefix that comes back is not hashed again.
"""

from __future__ import annotations

import hashlib
import time

from serving.upstreams import ModelRoute, Replica

DEFAULT_PREFIX_CHARS = 256
DEFAULT_MAX_IMBALANCE = 4


def prefix_key(body: dict, prefix_chars: int = DEFAULT_PREFIX_CHARS) -> bytes:
    """The first `prefix_chars` characters of the prompt as the engine will see it (roughly)."""
    prompt = body.get("prompt")
    if prompt is not None:
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
            if isinstance(prompt, list):  # token ids
                return repr(prompt[: prefix_chars // 4]).encode()
        return str(prompt)[:prefix_chars].encode()
    parts: list[str] = []
    size = 0
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        piece = f"{message.get('role', '')}:{content or ''}\n"
        parts.append(piece)
        size += len(piece)
        if size >= prefix_chars:
            break
    return "".join(parts)[:prefix_chars].encode()


def _score(key: bytes, replica_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + b"\x00" + replica_id.encode(), digest_size=8).digest(), "big")


# The rank order of the prefix keys seen last (key and replica ids -> positions in rank order): the
# prefixes that routing exists for (system prompts, conversations, documents) come back again and
# again, and their order is the same every time; hashing it anew was most of a pick's cost.
_RANKS: dict[tuple[bytes, tuple[str, ...]], tuple[int, ...]] = {}
_RANKS_MAX = 4096


def rank_replicas(key: bytes, replicas: list[Replica]) -> list[Replica]:
    """Replicas in rendezvous-hash preference order for `key`."""
    ids = tuple(replica.replica_id for replica in replicas)
    order = _RANKS.get((key, ids))
    if order is None:
        scores = [_score(key, replica_id) for replica_id in ids]
        order = tuple(sorted(range(len(ids)), key=scores.__getitem__, reverse=True))
        if len(_RANKS) >= _RANKS_MAX:
            _RANKS.clear()
        _RANKS[key, ids] = order
    return [replicas[position] for position in order]


def pick_replica(
    route: ModelRoute,
    body: dict,
    *,
    exclude: set[str] | None = None,
    healthy_only: bool = False,
    prefix_chars: int = DEFAULT_PREFIX_CHARS,
    max_imbalance: int = DEFAULT_MAX_IMBALANCE,
    now: float | None = None,
) -> Replica | None:
    """The replica for this request among `route`'s, minus the `exclude`d replica ids; None only
    when every replica is excluded, or with `healthy_only` when every remaining one is open."""
    replicas = route.replicas
    if exclude:
        replicas = [replica for replica in replicas if replica.replica_id not in exclude]
        if not replicas:
            return None
    if len(replicas) == 1:
        only = replicas[0]
        if not only.down_until or not healthy_only:
            return only
        return only if only.is_up(time.monotonic() if now is None else now) else None
    now = time.monotonic() if now is None else now
    live = [replica for replica in replicas if replica.is_up(now)]
    if not live:  # every breaker is open
        if healthy_only:
            return None
        return min(replicas, key=lambda replica: replica.down_until)  # the first to reopen
    if route.routing == "round_robin":
        route._next = (route._next + 1) % len(live)
        return live[route._next]
    least = min(replica.in_flight for replica in live)
    for replica in rank_replicas(prefix_key(body, prefix_chars), live):
        if replica.in_flight - least <= max_imbalance:
            return replica
    return min(live, key=lambda replica: replica.in_flight)  # unreachable: the least loaded always fits


def pick_in_chain(
    route: ModelRoute, body: dict, exclude: set[str] | None = None, *, now: float | None = None
) -> tuple[ModelRoute, Replica] | None:
    """(model, replica) for a try: a usable replica of `route` not in `exclude`, else of its
    fallback models in order; if every remaining replica of the chain is open, the one whose
    cool-down ends first. None when every replica of the chain was tried."""
    routes = route.chain()
    now = time.monotonic() if now is None else now
    for candidate in routes:
        replica = pick_replica(candidate, body, exclude=exclude, healthy_only=True, now=now)
        if replica is not None:
            return candidate, replica
    best: tuple[ModelRoute, Replica] | None = None
    for candidate in routes:
        for replica in candidate.replicas:
            if exclude and replica.replica_id in exclude:
                continue
            if best is None or replica.down_until < best[1].down_until:
                best = (candidate, replica)
    return best
