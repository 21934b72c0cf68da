"""Who is calling: the tenant check every API shares.

A bearer token resolves to a Principal:
- the admin token (INFERMETER_ADMIN_TOKEN): any customer;
- the producer token (INFERMETER_PRODUCER_TOKEN): may publish events for any customer, reads nothing;
- a customer API key (serving.keys, stored hashed): that customer's own data only.
Endpoints call `principal.customer_scope(requested)` and answer 404 when a customer asks for
another customer's object, so that existence is not disclosed.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Literal

PrincipalKind = Literal["admin", "producer", "customer"]


class AuthError(Exception):
    """No or bad credentials (401)."""


class Forbidden(Exception):
    """Valid credentials that may not do this (403)."""


@dataclass(frozen=True)
class Principal:
    kind: PrincipalKind
    customer_id: str | None = None
    api_key_id: str | None = None
    project_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    def customer_scope(self, requested: str | None) -> str | None:
        """The customer id a read is limited to; None means every customer (admin only)."""
        if self.kind == "admin":
            return requested
        if self.kind == "customer":
            if requested is not None and requested != self.customer_id:
                raise LookupError("not found")
            return self.customer_id
        raise Forbidden("producer credentials cannot read usage")

    def may_act_for(self, customer_id: str) -> bool:
        return self.kind in ("admin", "producer") or self.customer_id == customer_id


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise AuthError("missing Authorization header (expected 'Bearer <token>')")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("Authorization header must be 'Bearer <token>'")
    return token.strip()


def static_principal(token: str, admin_token: str, producer_token: str) -> Principal | None:
    """The admin or producer principal for a configured token, else None (try API keys next)."""
    if hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(kind="admin")
    if hmac.compare_digest(token.encode(), producer_token.encode()):
        return Principal(kind="producer")
    return None
