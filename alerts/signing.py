"""Webhook signatures, as Stripe signs its webhooks: pure (the standard library's hmac).

Each attempt carries `Infermeter-Signature: t=<unix seconds>,v1=<hex>`, where hex is
HMAC-SHA256(the endpoint's secret, "<t>.<raw body>"). t is the attempt's own time, so a receiver
refuses a request whose t is too old (a replay of a captured request) and recognises a delivery it
already processed by its id (`Infermeter-Delivery`, also the body's "id"), which stays the same
across retries. The receiver's recipe, with a Python snippet: docs/alerts.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "Infermeter-Signature"
DELIVERY_HEADER = "Infermeter-Delivery"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh endpoint secret: whsec_ and 43 URL-safe characters (256 random bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of "<timestamp>.<body>" under `secret`."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    """The Infermeter-Signature header's value: t=<timestamp>,v1=<signature>."""
    return f"t={timestamp},v1={signature(secret, timestamp, body)}"
