"""Which replica served a prompt prefix recently: the router's memory behind `prefix_seen`.

The cost anatomy (docs/cost-model.md, "Cost anatomy") charges as *context not reused* the uncached
prefill of a request whose prompt prefix the platform had already served: a cache miss that a better
eviction or routing choice could have avoided. Only the gateway sees every request of a model, so it
records that claim on the request's event: `prefix_seen` (bool) and `prefix_seen_replica` (the
replica that served the prefix last).

`PrefixMemory` keeps, per model, the prefix keys it served recently (serving/routing.py `prefix_key`:
the prompt's first characters, what prefix routing hashes) with the replica that served each last,
in least-recently-served order, bounded

- by count: at most `max_entries` keys per model (INFERMETER_PREFIX_MEMORY_ENTRIES); serving one more
  forgets the least recently served;
- by age: a key not served for `max_age_s` (INFERMETER_PREFIX_MEMORY_MAX_AGE_S) is forgotten; a prefix
  that old is not one an engine's prefix cache could be expected to still hold.

`observe` is called once per request, where the gateway builds its event (serving/relay.py `finish`):
it answers what the memory held before this request (None: not seen; else the replica) and, when the
request reached an engine's prefill (vLLM reported its prompt tokens), records the request's replica
as the prefix's latest. So requests count in the order they finish; two requests with the same prefix
running at the same time see each other only once the first finished.

Cost on the gateway's hot path: one `prefix_key` (a slice of the prompt), one `hash` of it and a few
dict operations; keys are stored as their 64-bit `hash` (a false "seen" needs two different prefixes
with the same hash among the model's last `max_entries`: about n^2 / 2^65, negligible). The memory is
per gateway process: behind a load balancer with several gateways, a prefix served by another
gateway counts as not seen (docs/cost-model.md, "Limits of the anatomy").
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from serving.routing import DEFAULT_PREFIX_CHARS, prefix_key

DEFAULT_MAX_ENTRIES = 50_000
DEFAULT_MAX_AGE_S = 600.0


class PrefixMemory:
    """Per model: prefix key hash -> (replica id, when it last served it), least recently served first."""

    __slots__ = ("max_entries", "max_age_s", "prefix_chars", "_clock", "_models")

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        *,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_age_s < 0:
            raise ValueError("the prefix memory needs max_entries >= 1 and max_age_s >= 0")
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self.prefix_chars = prefix_chars
        self._clock = clock
        self._models: dict[str, OrderedDict[int, tuple[str, float]]] = {}

    @classmethod
    def from_settings(cls, settings) -> PrefixMemory:
        return cls(settings.prefix_memory_entries, settings.prefix_memory_max_age_s)

    def observe(self, model: str, body: dict, replica_id: str | None, *, served: bool) -> str | None:
        """The replica that served this request's prompt prefix before (None: not within the bounds);
        then, if `served` (the prompt reached `replica_id`'s engine), remember `replica_id` as its latest."""
        return self.observe_key(model, hash(prefix_key(body, self.prefix_chars)), replica_id, served=served)

    def observe_key(self, model: str, key: int, replica_id: str | None, *, served: bool) -> str | None:
        now = self._clock()
        entries = self._models.get(model)
        if entries is None:
            if not served or replica_id is None:
                return None
            entries = self._models[model] = OrderedDict()
        # forget what is too old: the least recently served come first
        horizon = now - self.max_age_s
        while entries:
            oldest = next(iter(entries.values()))
            if oldest[1] >= horizon:
                break
            entries.popitem(last=False)
        before = entries.get(key)
        if served and replica_id is not None:
            entries[key] = (replica_id, now)
            entries.move_to_end(key)
            if len(entries) > self.max_entries:
                entries.popitem(last=False)
        return None if before is None else before[0]

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._models.values())


__all__ = ["DEFAULT_MAX_AGE_S", "DEFAULT_MAX_ENTRIES", "PrefixMemory"]
