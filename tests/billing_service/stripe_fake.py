"""A strict fake of the few Stripe API v1 endpoints the adapter uses, served over real HTTP.

For what localstripe lacks: invoices for customers without a subscription, finalize, void, and
idempotency keys. `StripeFake().start()` serves a Starlette app with uvicorn on 127.0.0.1 (a free port)
in a thread; point `stripe.StripeClient(key, base_addresses={"api": fake.url})` at it.

Endpoints (and only these parameters; anything else is a 400 `invalid_request_error` naming the `param`):

    POST /v1/customers                   name, email, description, metadata
    GET  /v1/customers                   email, limit, starting_after
    GET  /v1/customers/{id}
    POST /v1/customers/{id}              name, email ("" removes it), description, metadata
    POST /v1/invoiceitems                customer*, amount*, currency*, description, metadata
    GET  /v1/invoiceitems                customer, invoice, pending, limit, starting_after
    POST /v1/invoices                    customer*, currency, auto_advance, pending_invoice_items_behavior,
                                         number, description, metadata
    GET  /v1/invoices                    customer, status, limit, starting_after
    GET  /v1/invoices/{id}
    POST /v1/invoices/{id}/finalize      auto_advance
    POST /v1/invoices/{id}/void          (none)
    GET  /v1/invoices/{id}/lines         limit, starting_after
    POST /v1/credit_notes                invoice*, lines (type*, invoice_line_item, amount, description, quantity,
                                         unit_amount, metadata), amount, memo, metadata, reason, email_type,
                                         effective_at, refund_amount, credit_amount, out_of_band_amount
    GET  /v1/credit_notes                customer, invoice, limit, starting_after
    GET  /v1/credit_notes/{id}
    (* required)

Credit notes follow Stripe's documented rules (API 2026-10-28, `CreditNoteCreateParams` of stripe-python
16): one of `amount` or `lines` is required (`shipping_cost` is documented but not implemented here); an
`invoice_line_item` line credits `amount` of a line of the invoice (at most what is left uncredited on
it), a `custom_line_item` line credits `unit_amount` x `quantity` (default 1) and needs a `description`;
`amount` with lines must equal their sum; the credit note total must be positive and at most the invoice
total less its earlier credit notes; only an open, paid or uncollectible invoice takes one. The total
first reduces the invoice's `amount_remaining` (`pre_payment_amount`); the rest (`post_payment_amount`)
must equal `refund_amount + credit_amount + out_of_band_amount`. `StripeFake.pay(api_key, invoice_id)`
(tests) marks an open invoice paid, so a post-payment credit note can be tried. Refunds and customer
balances are recorded on the credit note only (no charge, no balance).

Documented Stripe parameters outside this list (`expand`, `period`, `price_data`, ...) are refused with a
message saying the fake does not implement them, so a test never passes on a parameter the fake ignored.

Idempotency (Stripe's documented rules for API v1): the status and body of the first POST with a given
`Idempotency-Key` are saved once the endpoint starts executing, and a retry with the same key and the
same endpoint and parameters gets that response again (header `Idempotent-Replayed: true`), errors
included; the same key with another endpoint or other parameters is a 400 `idempotency_error`. A request
refused while validating its parameters is not saved (it may be retried with the same key). Keys are
scoped per API key (an API key is an account here: objects too), are at most 255 characters, and are
pruned 24 hours after first use (`clock` is injectable, so a test can let them expire). GET requests
ignore the header.

Invoice states: draft -> open (finalize) -> void (void). Finalizing assigns a number when the draft has
none. Not modelled: payment (an open invoice stays open), automatic finalization, zero-total invoices
being marked paid at finalization, taxes, discounts.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

IDEMPOTENCY_TTL_S = 24 * 3600
MAX_KEY = 255


class StripeError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, saved: bool = True) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.saved = saved  # False: refused before the endpoint ran (validation), not saved for the key

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.param is not None:
            err["param"] = self.param
        if self.code is not None:
            err["code"] = self.code
        return {"error": err}


def _invalid(message: str, param: str | None, code: str = "parameter_invalid") -> StripeError:
    return StripeError(400, message, param=param, code=code, saved=False)


# ---------------------------------------------------------------- form decoding


def decode_form(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Stripe's form encoding: `metadata[a]=1` -> {"metadata": {"a": "1"}}, `expand[0]=x` -> {"expand": ["x"]}."""
    out: dict[str, Any] = {}
    for raw_key, value in pairs:
        match = re.fullmatch(r"([^\[\]]+)((?:\[[^\[\]]*\])*)", raw_key)
        if not match:
            raise _invalid(f"Invalid parameter name: {raw_key}", raw_key)
        parts = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))]
        node = out
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if last:
                if part in node:
                    raise _invalid(f"Parameter {raw_key} given twice", raw_key)
                node[part] = value
            else:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    raise _invalid(f"Parameter {'['.join(parts[: i + 1])} is both a value and a hash", raw_key)
                node = child
    return _lists(out)


def _lists(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _lists(v) for k, v in node.items()}
        if node and all(k.isdigit() for k in node):
            return [node[k] for k in sorted(node, key=int)]
    return node


# ---------------------------------------------------------------- parameter checks


def _str(name: str, value: Any, max_len: int = 5000) -> str:
    if not isinstance(value, str):
        raise _invalid(f"Invalid string: {name} must be a string", name)
    if len(value) > max_len:
        raise _invalid(f"Invalid string: {name} is longer than {max_len} characters", name)
    return value


def _int(name: str, value: Any) -> int:
    if not isinstance(value, str) or not re.fullmatch(r"-?\d+", value):
        raise _invalid(f"Invalid integer: {value!r}", name, "parameter_invalid_integer")
    return int(value)


def _bool(name: str, value: Any) -> bool:
    if value not in ("true", "false"):
        raise _invalid(f"Invalid boolean: {value!r}", name)
    return value == "true"


def _currency(name: str, value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z]{3}", value):
        raise _invalid(f"Invalid currency: {value!r} (three-letter ISO code, in lowercase)", name)
    return value


def _metadata(name: str, value: Any) -> dict[str, str]:
    if value == "":
        return {}
    if not isinstance(value, dict):
        raise _invalid("Invalid metadata: it must be a hash of string keys and values", name)
    if len(value) > 50:
        raise _invalid("Invalid metadata: at most 50 keys", name)
    for k, v in value.items():
        if len(k) > 40:
            raise _invalid(f"Invalid metadata: key {k!r} is longer than 40 characters", f"{name}[{k}]")
        if not isinstance(v, str) or len(v) > 500:
            raise _invalid(f"Invalid metadata: the value of {k!r} must be a string of at most 500 characters",
                           f"{name}[{k}]")
    return {k: v for k, v in value.items() if v != ""}


def _enum(*allowed: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if value not in allowed:
            raise _invalid(f"Invalid {name}: must be one of {', '.join(allowed)}", name)
        return value

    return check


def _limit(name: str, value: Any) -> int:
    n = _int(name, value)
    if not 1 <= n <= 100:
        raise _invalid("Invalid limit: must be between 1 and 100", name)
    return n


# Documented by Stripe for these endpoints but not implemented here: refused with that reason.
NOT_IMPLEMENTED = frozenset({
    "expand", "period", "price_data", "pricing", "quantity", "quantity_decimal", "unit_amount_decimal",
    "discounts", "discountable", "tax_rates", "tax_behavior", "tax_code", "subscription", "invoice",
    "collection_method", "days_until_due", "due_date", "default_payment_method", "account_tax_ids",
    "automatic_tax", "custom_fields", "footer", "from_invoice", "issuer", "on_behalf_of", "payment_settings",
    "rendering", "shipping_cost", "shipping_details", "statement_descriptor", "transfer_data", "address",
    "phone", "payment_method", "invoice_settings", "preferred_locales", "tax", "tax_exempt", "tax_id_data",
    "test_clock", "created", "ending_before", "customer_account", "balance", "cash_balance", "shipping",
    "source", "next_invoice_sequence", "invoice_prefix", "business_name", "individual_name", "validate",
    "application_fee_amount", "automatically_finalizes_at", "default_source", "default_tax_rates",
    "effective_at", "refunds", "tax_amounts",
})


@dataclass(frozen=True)
class Spec:
    params: dict[str, Callable[[str, Any], Any]]
    required: tuple[str, ...] = ()

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in data.items():
            check = self.params.get(name)
            if check is None:
                if name in NOT_IMPLEMENTED:
                    raise _invalid(
                        f"Parameter {name} is documented by Stripe but not implemented by this fake "
                        f"(tests/billing_service/stripe_fake.py): the adapter does not send it", name, "parameter_unknown")
                raise _invalid(f"Received unknown parameter: {name}", name, "parameter_unknown")
            out[name] = check(name, value)
        for name in self.required:
            if name not in out:
                raise _invalid(f"Missing required param: {name}.", name, "parameter_missing")
        return out


LIST = {"limit": _limit, "starting_after": _str}


def _non_negative(name: str, value: Any) -> int:
    n = _int(name, value)
    if n < 0:
        raise _invalid(f"Invalid {name}: must be greater than or equal to 0", name)
    return n


CREDIT_NOTE_LINE = {"type": _enum("invoice_line_item", "custom_line_item"), "invoice_line_item": _str,
                    "amount": _non_negative, "description": _str, "quantity": _non_negative,
                    "unit_amount": _non_negative, "metadata": _metadata}
# documented for a credit note line, not implemented here (refused with that reason)
CREDIT_NOTE_LINE_NOT_IMPLEMENTED = frozenset({"tax_amounts", "tax_rates", "unit_amount_decimal"})


def _credit_note_lines(name: str, value: Any) -> list[dict[str, Any]]:
    """`lines[i][...]`: each a hash of the documented line parameters, checked per type."""
    if not isinstance(value, list) or not value or not all(isinstance(x, dict) for x in value):
        raise _invalid(f"Invalid array: {name} must be a non-empty array of hashes", name)
    out = []
    for i, raw in enumerate(value):
        line: dict[str, Any] = {}
        for key, item in raw.items():
            param = f"{name}[{i}][{key}]"
            if key in CREDIT_NOTE_LINE_NOT_IMPLEMENTED:
                raise _invalid(f"Parameter {param} is documented by Stripe but not implemented by this fake "
                               f"(tests/billing_service/stripe_fake.py): the adapter does not send it", param,
                               "parameter_unknown")
            if key not in CREDIT_NOTE_LINE:
                raise _invalid(f"Received unknown parameter: {param}", param, "parameter_unknown")
            line[key] = CREDIT_NOTE_LINE[key](param, item)
        if "type" not in line:
            raise _invalid(f"Missing required param: {name}[{i}][type].", f"{name}[{i}][type]", "parameter_missing")
        if line["type"] == "invoice_line_item":
            only_custom = [k for k in ("description", "unit_amount") if k in line]
            if only_custom:
                raise _invalid(f"{name}[{i}][{only_custom[0]}] is only valid when type is custom_line_item",
                               f"{name}[{i}][{only_custom[0]}]")
            if "invoice_line_item" not in line:
                raise _invalid(f"Missing required param: {name}[{i}][invoice_line_item].",
                               f"{name}[{i}][invoice_line_item]", "parameter_missing")
            if "amount" not in line:  # Stripe also credits by quantity; the adapter sends amounts
                raise _invalid(f"{name}[{i}]: this fake credits an invoice line by amount only: pass amount",
                               f"{name}[{i}][amount]", "parameter_missing")
        else:
            only_invoice = [k for k in ("invoice_line_item", "amount") if k in line]
            if only_invoice:
                raise _invalid(f"{name}[{i}][{only_invoice[0]}] is only valid when type is invoice_line_item",
                               f"{name}[{i}][{only_invoice[0]}]")
            for needed in ("description", "unit_amount"):
                if needed not in line:
                    raise _invalid(f"Missing required param: {name}[{i}][{needed}].", f"{name}[{i}][{needed}]",
                                   "parameter_missing")
            if line.get("quantity", 1) < 1:
                raise _invalid(f"Invalid {name}[{i}][quantity]: must be at least 1", f"{name}[{i}][quantity]")
        out.append(line)
    return out
SPECS = {
    ("POST", "customers"): Spec({"name": _str, "email": _str, "description": _str, "metadata": _metadata}),
    ("GET", "customers"): Spec({"email": _str, **LIST}),
    ("POST", "update_customer"): Spec({"name": _str, "email": _str, "description": _str, "metadata": _metadata}),
    ("POST", "invoiceitems"): Spec(
        {"customer": _str, "amount": _int, "currency": _currency, "description": _str, "metadata": _metadata},
        ("customer", "amount", "currency"),
    ),
    ("GET", "invoiceitems"): Spec({"customer": _str, "invoice": _str, "pending": _bool, **LIST}),
    ("POST", "invoices"): Spec(
        {"customer": _str, "currency": _currency, "auto_advance": _bool,
         "pending_invoice_items_behavior": _enum("exclude", "include"), "number": _str, "description": _str,
         "metadata": _metadata},
        ("customer",),
    ),
    ("GET", "invoices"): Spec({"customer": _str, "status": _enum("draft", "open", "paid", "uncollectible", "void"),
                               **LIST}),
    ("GET", "retrieve"): Spec({}),
    ("POST", "finalize"): Spec({"auto_advance": _bool}),
    ("POST", "void"): Spec({}),
    ("GET", "invoice_lines"): Spec({**LIST}),
    ("POST", "credit_notes"): Spec(
        {"invoice": _str, "lines": _credit_note_lines, "amount": _non_negative, "memo": _str,
         "metadata": _metadata, "reason": _enum("duplicate", "fraudulent", "order_change", "product_unsatisfactory"),
         "email_type": _enum("credit_note", "none"), "effective_at": _int, "refund_amount": _non_negative,
         "credit_amount": _non_negative, "out_of_band_amount": _non_negative},
        ("invoice",),
    ),
    ("GET", "credit_notes"): Spec({"customer": _str, "invoice": _str, **LIST}),
}


# ---------------------------------------------------------------- the account


class Account:
    """The objects and idempotency keys of one API key."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"customer": {}, "invoiceitem": {}, "invoice": {},
                                                              "credit_note": {}}
        self.order: dict[str, int] = {}  # id -> creation sequence (lists are newest first)
        self.keys: dict[str, tuple[str, int, dict[str, Any], float]] = {}  # key -> fingerprint, status, body, at
        self.invoice_numbers = 0


class StripeFake:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.accounts: dict[str, Account] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, idempotency key)
        self._lock = threading.Lock()
        self._seq = 0
        self.app = Starlette(routes=[
            Route("/v1/{rest:path}", self._handle, methods=["GET", "POST", "DELETE"]),
        ])
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # ------------------------------------------------------------ serving

    def start(self) -> StripeFake:
        import uvicorn

        from infermeter.stack.ports import free_port, wait_for_port

        port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="stripe-fake", daemon=True)
        self._thread.start()
        wait_for_port("127.0.0.1", port, 10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            assert self._thread is not None
            self._thread.join(10)
            self._server = None

    def __enter__(self) -> StripeFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ inspection (tests)

    def count(self, api_key: str, kind: str, **where: Any) -> int:
        return len(self.list_objects(api_key, kind, **where))

    def list_objects(self, api_key: str, kind: str, **where: Any) -> list[dict[str, Any]]:
        account = self.accounts.get(api_key)
        if account is None:
            return []
        return [o for o in account.objects[kind].values() if all(o.get(k) == v for k, v in where.items())]

    def pay(self, api_key: str, invoice_id: str) -> dict[str, Any]:
        """Mark an open invoice paid (what a successful collection would do; tests only)."""
        with self._lock:
            account = self.accounts[api_key]
            obj = account.objects["invoice"][invoice_id]
            if obj["status"] != "open":
                raise ValueError(f"invoice {invoice_id} is {obj['status']}: only an open invoice is paid")
            obj["amount_paid"] = self._invoice_view(account, obj)["amount_remaining"]
            obj["status"] = "paid"
            obj["status_transitions"] = {**obj["status_transitions"], "paid_at": int(self.clock())}
            return self._invoice_view(account, obj)

    # ------------------------------------------------------------ HTTP

    async def _handle(self, request: Request) -> Response:
        body = (await request.body()).decode()
        key = request.headers.get("idempotency-key")
        self.requests.append((request.method, request.url.path, key))
        try:
            api_key = _api_key(request.headers.get("authorization"))
            pairs = parse_qsl(body, keep_blank_values=True) if request.method == "POST" else list(
                parse_qsl(request.url.query, keep_blank_values=True))
            data = decode_form(pairs)
        except StripeError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        with self._lock:
            account = self.accounts.setdefault(api_key, Account())
            if request.method != "POST" or key is None:
                status, body, _ = self._run(account, request.method, request.url.path, data)
                return self._respond(status, body)
            return self._idempotent(account, key, request.method, request.url.path, data)

    def _idempotent(self, account: Account, key: str, method: str, path: str, data: dict[str, Any]) -> Response:
        if len(key) > MAX_KEY:
            return self._respond(400, _invalid(f"Idempotency-Key is longer than {MAX_KEY} characters", None).body())
        now = self.clock()
        for k in [k for k, (_, _, _, at) in account.keys.items() if now - at >= IDEMPOTENCY_TTL_S]:
            del account.keys[k]
        fingerprint = json.dumps([method, path, data], sort_keys=True)
        saved = account.keys.get(key)
        if saved is not None:
            if saved[0] != fingerprint:
                return self._respond(400, StripeError(
                    400, f"Keys for idempotent requests can only be used with the same parameters they were first "
                         f"used with. Try using a key other than '{key}' if you meant to execute a different request.",
                    type="idempotency_error").body())
            return self._respond(saved[1], saved[2], replayed=True)
        status, body, keep = self._run(account, method, path, data)
        if keep:
            account.keys[key] = (fingerprint, status, body, now)
        return self._respond(status, body)

    @staticmethod
    def _respond(status: int, body: dict[str, Any], replayed: bool = False) -> Response:
        headers = {"Request-Id": "req_" + secrets.token_hex(7)}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return JSONResponse(body, status_code=status, headers=headers)

    def _run(self, account: Account, method: str, path: str, data: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
        """(status, body, whether an idempotency key saves this answer)."""
        try:
            return 200, self._route(account, method, path, data), True
        except StripeError as exc:
            return exc.status, exc.body(), exc.saved

    def _route(self, account: Account, method: str, path: str, data: dict[str, Any]) -> dict[str, Any]:
        parts = path.strip("/").split("/")[1:]  # drop "v1"
        resource = parts[0] if parts else ""
        if resource in ("customers", "invoiceitems", "invoices", "credit_notes") and len(parts) == 1:
            params = SPECS[(method, resource)].check(data) if (method, resource) in SPECS else None
            if params is not None:
                if method == "GET":
                    return self._list(account, resource, params)
                return getattr(self, f"_create_{resource}")(account, params)
        elif resource == "customers" and len(parts) == 2 and method == "POST":
            return self._update_customer(account, parts[1], SPECS[("POST", "update_customer")].check(data))
        elif resource in ("customers", "invoiceitems", "invoices", "credit_notes") and len(parts) == 2 \
                and method == "GET":
            SPECS[("GET", "retrieve")].check(data)
            return self._get(account, _KIND[resource], parts[1])
        elif resource == "invoices" and len(parts) == 3 and method == "POST" and parts[2] in ("finalize", "void"):
            params = SPECS[("POST", parts[2])].check(data)
            return getattr(self, f"_{parts[2]}")(account, parts[1], params)
        elif resource == "invoices" and len(parts) == 3 and method == "GET" and parts[2] == "lines":
            params = SPECS[("GET", "invoice_lines")].check(data)
            lines = self._get(account, "invoice", parts[1])["lines"]["data"]
            return _page(lines, params, f"/v1/invoices/{parts[1]}/lines")
        raise StripeError(404, f"Unrecognized request URL ({method}: {path}). This fake implements only the "
                               f"endpoints the infermeter adapter uses.", saved=False)

    # ------------------------------------------------------------ objects

    def _new_id(self, account: Account, prefix: str) -> str:
        self._seq += 1
        obj_id = prefix + secrets.token_hex(7)
        account.order[obj_id] = self._seq
        return obj_id

    def _get(self, account: Account, kind: str, obj_id: str, param: str | None = None) -> dict[str, Any]:
        obj = account.objects[kind].get(obj_id)
        if obj is None:
            raise StripeError(404, f"No such {kind}: '{obj_id}'", param=param or "id", code="resource_missing")
        if kind == "invoice":
            return self._invoice_view(account, obj)
        return dict(obj)

    def _list(self, account: Account, resource: str, params: dict[str, Any]) -> dict[str, Any]:
        kind = _KIND[resource]
        rows = sorted(account.objects[kind].values(), key=lambda o: -account.order[o["id"]])
        for name in ("customer", "email", "status", "invoice"):
            if name in params:
                rows = [o for o in rows if o.get(name) == params[name]]
        if "pending" in params:
            rows = [o for o in rows if (o.get("invoice") is None) == params["pending"]]
        data = [self._invoice_view(account, o) if kind == "invoice" else dict(o) for o in rows]
        return _page(data, params, f"/v1/{resource}")

    def _create_customers(self, account: Account, p: dict[str, Any]) -> dict[str, Any]:
        obj = {"id": self._new_id(account, "cus_"), "object": "customer", "created": int(self.clock()),
               "livemode": False, "name": p.get("name"), "email": p.get("email"),
               "description": p.get("description"), "metadata": p.get("metadata", {}), "currency": None}
        account.objects["customer"][obj["id"]] = obj
        return dict(obj)

    def _update_customer(self, account: Account, customer_id: str, p: dict[str, Any]) -> dict[str, Any]:
        self._get(account, "customer", customer_id)
        obj = account.objects["customer"][customer_id]
        for name in ("name", "email", "description"):
            if name in p:
                obj[name] = p[name] or None  # Stripe: an empty string unsets the field
        if "metadata" in p:
            obj["metadata"] = {**obj["metadata"], **p["metadata"]}
        return dict(obj)

    def _create_invoiceitems(self, account: Account, p: dict[str, Any]) -> dict[str, Any]:
        customer = self._get(account, "customer", p["customer"], "customer")
        now = int(self.clock())
        obj = {"id": self._new_id(account, "ii_"), "object": "invoiceitem", "amount": p["amount"],
               "currency": p["currency"], "customer": customer["id"], "date": now, "livemode": False,
               "description": p.get("description"), "metadata": p.get("metadata", {}), "invoice": None,
               "period": {"start": now, "end": now}, "quantity": 1}
        account.objects["invoiceitem"][obj["id"]] = obj
        account.objects["customer"][customer["id"]]["currency"] = customer["currency"] or p["currency"]
        return dict(obj)

    def _create_invoices(self, account: Account, p: dict[str, Any]) -> dict[str, Any]:
        customer = self._get(account, "customer", p["customer"], "customer")
        currency = p.get("currency") or customer["currency"]
        if currency is None:
            raise StripeError(400, "The customer has no currency yet: pass currency", param="currency")
        invoice_id = self._new_id(account, "in_")
        items = []
        if p.get("pending_invoice_items_behavior", "exclude") == "include":
            items = [i for i in account.objects["invoiceitem"].values()
                     if i["customer"] == customer["id"] and i["invoice"] is None and i["currency"] == currency]
        obj = {"id": invoice_id, "object": "invoice", "customer": customer["id"], "currency": currency,
               "status": "draft", "auto_advance": p.get("auto_advance", False), "number": p.get("number"),
               "description": p.get("description"), "metadata": p.get("metadata", {}), "livemode": False,
               "created": int(self.clock()), "amount_paid": 0,
               "status_transitions": {"finalized_at": None, "paid_at": None, "voided_at": None}}
        for item in sorted(items, key=lambda i: account.order[i["id"]]):
            item["invoice"] = invoice_id
        account.objects["invoice"][invoice_id] = obj
        return self._invoice_view(account, obj)

    def _invoice_view(self, account: Account, obj: dict[str, Any]) -> dict[str, Any]:
        items = sorted((i for i in account.objects["invoiceitem"].values() if i["invoice"] == obj["id"]),
                       key=lambda i: account.order[i["id"]])
        lines = [{"id": "il_" + i["id"][3:], "object": "line_item", "amount": i["amount"],
                  "currency": i["currency"], "description": i["description"], "metadata": dict(i["metadata"]),
                  "invoice": obj["id"],
                  "parent": {"type": "invoice_item_details", "invoice_item_details": {"invoice_item": i["id"]}}}
                 for i in items]
        total = sum(i["amount"] for i in items)
        notes = [n for n in account.objects["credit_note"].values() if n["invoice"] == obj["id"]]
        pre = sum(n["pre_payment_amount"] for n in notes)
        due = 0 if obj["status"] == "void" else max(total - pre, 0)  # a pre-payment credit note lowers it
        return {**obj, "subtotal": total, "total": total, "amount_due": due,
                "amount_remaining": due - obj["amount_paid"], "pre_payment_credit_notes_amount": pre,
                "post_payment_credit_notes_amount": sum(n["post_payment_amount"] for n in notes),
                "lines": {"object": "list", "url": f"/v1/invoices/{obj['id']}/lines", "has_more": False,
                          "total_count": len(lines), "data": lines}}

    def _finalize(self, account: Account, invoice_id: str, p: dict[str, Any]) -> dict[str, Any]:
        self._get(account, "invoice", invoice_id)
        obj = account.objects["invoice"][invoice_id]
        if obj["status"] != "draft":
            raise StripeError(400, f"Invoice {invoice_id} is already finalized (status {obj['status']}): "
                                   f"only a draft can be finalized", code="invoice_not_editable")
        if obj["number"] is None:
            account.invoice_numbers += 1
            obj["number"] = f"FAKE-{account.invoice_numbers:04d}"
        obj["status"] = "open"
        if "auto_advance" in p:
            obj["auto_advance"] = p["auto_advance"]
        obj["status_transitions"] = {**obj["status_transitions"], "finalized_at": int(self.clock())}
        return self._invoice_view(account, obj)

    def _void(self, account: Account, invoice_id: str, p: dict[str, Any]) -> dict[str, Any]:
        self._get(account, "invoice", invoice_id)
        obj = account.objects["invoice"][invoice_id]
        if obj["status"] not in ("open", "uncollectible"):
            raise StripeError(400, f"Invoice {invoice_id} is {obj['status']}: only a finalized (open or "
                                   f"uncollectible) invoice can be voided")
        obj["status"] = "void"
        obj["status_transitions"] = {**obj["status_transitions"], "voided_at": int(self.clock())}
        return self._invoice_view(account, obj)

    def _create_credit_notes(self, account: Account, p: dict[str, Any]) -> dict[str, Any]:
        if "lines" not in p and "amount" not in p:
            raise _invalid("One of amount, lines, or shipping_cost must be provided.", "lines", "parameter_missing")
        invoice = self._get(account, "invoice", p["invoice"], "invoice")
        if invoice["status"] not in ("open", "paid", "uncollectible"):
            raise StripeError(400, f"Invoice {invoice['id']} is {invoice['status']}: a credit note can only be issued "
                                   f"on a finalized (open, paid or uncollectible) invoice", param="invoice",
                              code="invoice_not_editable")
        earlier = [n for n in account.objects["credit_note"].values() if n["invoice"] == invoice["id"]]
        credited_line: dict[str, int] = {}
        for note in earlier:
            for line in note["lines"]["data"]:
                if line["invoice_line_item"]:
                    credited_line[line["invoice_line_item"]] = credited_line.get(line["invoice_line_item"], 0) \
                        + line["amount"]
        invoice_lines = {line["id"]: line for line in invoice["lines"]["data"]}
        note_id = self._new_id(account, "cn_")
        lines: list[dict[str, Any]] = []
        for i, line in enumerate(p.get("lines", [])):
            if line["type"] == "invoice_line_item":
                target = invoice_lines.get(line["invoice_line_item"])
                if target is None:
                    raise StripeError(400, f"No such invoice line item on invoice {invoice['id']}: "
                                           f"'{line['invoice_line_item']}'", param=f"lines[{i}][invoice_line_item]",
                                      code="resource_missing")
                left = max(target["amount"], 0) - credited_line.get(target["id"], 0)
                if line["amount"] > left:
                    raise StripeError(400, f"The credit amount {line['amount']} for invoice line item {target['id']} "
                                           f"exceeds what is left to credit on it ({left})",
                                      param=f"lines[{i}][amount]")
                credited_line[target["id"]] = credited_line.get(target["id"], 0) + line["amount"]
                amount, quantity, unit, description = line["amount"], None, None, target["description"]
            else:
                quantity = line.get("quantity", 1)
                unit, description = line["unit_amount"], line["description"]
                amount = unit * quantity
            lines.append({"id": "cnli_" + secrets.token_hex(7), "object": "credit_note_line_item", "amount": amount,
                          "description": description, "invoice_line_item": line.get("invoice_line_item"),
                          "quantity": quantity, "type": line["type"], "unit_amount": unit,
                          "metadata": line.get("metadata", {})})
        total = sum(line["amount"] for line in lines) if lines else p["amount"]
        if lines and "amount" in p and p["amount"] != total:
            raise StripeError(400, f"amount {p['amount']} must equal the sum of the lines ({total})", param="amount")
        if total <= 0:
            raise StripeError(400, "The credit note total must be greater than 0", param="lines")
        left_on_invoice = invoice["total"] - sum(n["total"] for n in earlier)
        if total > left_on_invoice:
            raise StripeError(400, f"The credit note total {total} exceeds what is left to credit on invoice "
                                   f"{invoice['id']} ({left_on_invoice})", param="lines")
        pre = min(total, invoice["amount_remaining"])
        post = total - pre
        outside = sum(p.get(k, 0) for k in ("refund_amount", "credit_amount", "out_of_band_amount"))
        if outside != post:
            raise StripeError(400, f"The sum of refund_amount, credit_amount and out_of_band_amount ({outside}) must "
                                   f"equal the credit note's post-payment amount ({post}: total {total}, of which "
                                   f"{pre} lowers the invoice's amount remaining)", param="refund_amount")
        obj = {"id": note_id, "object": "credit_note", "invoice": invoice["id"], "customer": invoice["customer"],
               "currency": invoice["currency"], "amount": total, "subtotal": total, "total": total,
               "pre_payment_amount": pre, "post_payment_amount": post,
               "refunds": ([{"amount_refunded": p["refund_amount"], "refund": "re_" + secrets.token_hex(7),
                             "type": "refund"}] if p.get("refund_amount") else []),
               "customer_balance_transaction": "cbtxn_" + secrets.token_hex(7) if p.get("credit_amount") else None,
               "out_of_band_amount": p.get("out_of_band_amount"),
               "type": "pre_payment" if post == 0 else "post_payment" if pre == 0 else "mixed",
               "status": "issued", "number": f"{invoice['number']}-CN-{len(earlier) + 1:02d}",
               "memo": p.get("memo"), "metadata": p.get("metadata", {}), "reason": p.get("reason"),
               "created": int(self.clock()), "effective_at": p.get("effective_at"), "livemode": False,
               "lines": {"object": "list", "url": f"/v1/credit_notes/{note_id}/lines", "has_more": False,
                         "total_count": len(lines), "data": lines}}
        account.objects["credit_note"][note_id] = obj
        return dict(obj)


def _page(rows: list[dict[str, Any]], params: dict[str, Any], url: str) -> dict[str, Any]:
    """One page of a list (`limit`, default 10; `starting_after` an id of the list)."""
    if "starting_after" in params:
        ids = [o["id"] for o in rows]
        if params["starting_after"] not in ids:
            raise StripeError(400, f"starting_after {params['starting_after']} is not in this list",
                              param="starting_after", saved=False)
        rows = rows[ids.index(params["starting_after"]) + 1:]
    limit = params.get("limit", 10)
    return {"object": "list", "url": url, "has_more": len(rows) > limit, "data": rows[:limit]}


_KIND = {"customers": "customer", "invoiceitems": "invoiceitem", "invoices": "invoice", "credit_notes": "credit_note"}


def _api_key(header: str | None) -> str:
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.startswith(("sk_test_", "sk_live_", "rk_test_")):
        raise StripeError(401, "Invalid API Key provided (send Authorization: Bearer sk_test_...)", saved=False)
    return token
