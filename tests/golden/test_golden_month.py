"""The golden month: one deterministic November 2026 of usage, ingested through metering's real write
path, billed, previewed, exported and shown, compared to the cent with what the code gave when
`tests/golden/2026-11.json` was written. A change of how billing reads usage must give the same
invoices, previews, exports and dashboards on the same data; when a change is meant to alter them,
regenerate the file (`INFERMETER_WRITE_GOLDEN=1`, docs/testing.md) and explain the difference in the
commit.

The month (every customer's own 2026-11 period, cut by billing.periods):
- `utc-tokens` (UTC) and `nyc-tokens` (America/New_York: its period starts before the change from
  daylight time on 2026-11-01 and holds the repeated hour) under a per-token book with prices by model
  and by deployment; `utc-tokens` has a prepaid credit grant;
- `kol-tasks` (Asia/Kolkata, +05:30) under a per-task book (graduated tiers, failed tasks, attempts, a
  free allowance of a usage meter);
- `ktm-projects` (Asia/Kathmandu, +05:45) under a book with `invoice: {group_by: project}`;
- `a31-gpu` (anchor day 31: its 2026-10 period runs Oct 31 to Nov 30, its 2026-11 period Nov 30 to
  Dec 31; the run of 2026-11 bills both) under a book with GPU time of a dedicated replica;
- `unbilled-co`, with usage and no customer record (unbilled).
Seeded requests over three models and two deployments, with and without projects, cached input
tokens, errors and cancellations; tasks retried (attempt > 1) that succeed, fail or are abandoned;
usage meters (infermeter.usage.v1); and, per customer, events placed by hand on its period's edges
(the last microsecond before its start, its first microsecond, the last microsecond before its end,
its end) and a late batch that arrives after the drafts were made.

What is captured (`month`): the invoice preview of every customer (the service function the CLI
calls) before any run, and a what-if preview under the projects book without its grouping; the run
that drafts every invoice customer by customer (`bulk=False`: the path `--customer` takes), the drafts;
the late batch; the bulk run that refreshes and finalizes them, the invoices (status, number, lines,
subtotal, credits, total, history); the four finance exports of both periods as CSV text, now and as
of before the late batch; the customer dashboard's data (usage summary over the customer's period,
current-period spend, invoices) and GET /v1/usage over each customer's period, from the HTTP app.
The final invoices' quantities are also checked against a reference worked out from the events
written (`reference_quantities`), so the file pins figures known to be right, not only today's.
"""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from billing.periods import Period, billing_period
from billing_service.credits import credits_view, grant_credits
from billing_service.customers import assign_plan, set_customer
from billing_service.exports import KINDS, export
from billing_service.invoices import list_invoices, preview_invoice, show_invoice
from billing_service.run import billing_run
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import utc_text
from metering.writer import BatchWriter
from pricing_service.books import read_cost_model
from tests.conftest import new_database
from tests.metering.period_checks import Events

pytestmark = pytest.mark.xdist_group("golden-month")  # one worker builds the month once for the three tests

GOLDEN = Path(__file__).with_name("2026-11.json")
WRITE_GOLDEN = os.environ.get("INFERMETER_WRITE_GOLDEN") == "1"

COST = read_cost_model(None)
US = timedelta(microseconds=1)
SECOND, MIN, HOUR = timedelta(seconds=1), timedelta(minutes=1), timedelta(hours=1)

SETUP_AT = datetime(2026, 10, 20, tzinfo=UTC)  # customers, plans and the credit grant
RECEIVED_AT = datetime(2027, 1, 1, tzinfo=UTC)  # metering's clock when the month's events arrive
PREVIEW_AT = datetime(2027, 1, 1, 6, tzinfo=UTC)  # every period over: previews, then the drafting run
LATE_AT = datetime(2027, 1, 1, 12, tzinfo=UTC)  # the late batch arrives
FINAL_AT = datetime(2027, 1, 2, 6, tzinfo=UTC)  # every grace window (24 h) over: the bulk run finalizes
DRAFT_GRACE_H = 24 * 40  # the drafting run's grace window: no period is past it at PREVIEW_AT
LABEL = "2026-11"
LABELS = ("2026-10", "2026-11")

BOOKS = {
    "tokens": """\
id: golden-tokens
currency: USD
charges:
  - {meter: uncached_input_tokens, price: {type: unit, amount: "2.00", per: 1000000}}
  - {meter: uncached_input_tokens, model: big, price: {type: unit, amount: "6.00", per: 1000000}}
  - {meter: cached_input_tokens, price: {type: unit, amount: "0.50", per: 1000000}}
  - {meter: output_tokens, price: {type: unit, amount: "8.00", per: 1000000}}
  - {meter: output_tokens, model: big, price: {type: unit, amount: "24.00", per: 1000000}}
  - {meter: requests, price: {type: unit, amount: "0.0004", per: 1}}
  - {meter: requests, deployment: d2, price: {type: unit, amount: "0.0011", per: 1}}
  - {meter: "usage:tool_calls", price: {type: unit, amount: "0.003", per: 1}}
""",
    "tasks": """\
id: golden-tasks
currency: USD
charges:
  - meter: successful_tasks
    price: {type: tiered_graduated, tiers: [{up_to: 3, amount: "0.25"}, {up_to: null, amount: "0.20"}]}
  - {meter: failed_tasks, price: {type: unit, amount: "0.05", per: 1}}
  - {meter: task_attempts, price: {type: unit, amount: "0.01", per: 1}}
  - {meter: output_tokens, price: {type: unit, amount: "3.00", per: 1000000}}
  - {meter: "usage:verifier_s", free: "5", price: {type: unit, amount: "0.0002", per: 1}}
""",
    "projects": """\
id: golden-projects
currency: USD
invoice: {group_by: project}
charges:
  - {meter: uncached_input_tokens, price: {type: unit, amount: "1.55", per: 1000000}}
  - {meter: cached_input_tokens, price: {type: unit, amount: "0.78", per: 1000000}}
  - {meter: output_tokens, price: {type: unit, amount: "7.00", per: 1000000}}
  - {meter: output_tokens, model: m2, price: {type: unit, amount: "9.10", per: 1000000}}
  - {meter: requests, price: {type: unit, amount: "0.0003", per: 1}}
  - {meter: "usage:tool_calls", price: {type: unit, amount: "0.001", per: 1}}
""",
    "gpu": """\
id: golden-gpu
currency: USD
charges:
  - {meter: gpu_seconds, gpu_type: H100, price: {type: unit, amount: "4.00", per: 3600}}
  - {meter: uncached_input_tokens, price: {type: unit, amount: "0.90", per: 1000000}}
  - {meter: output_tokens, price: {type: unit, amount: "2.70", per: 1000000}}
""",
}
# the projects book without its grouping: the same charges, one line per charge and model
UNGROUPED = BOOKS["projects"].replace("invoice: {group_by: project}\n", "")
assert UNGROUPED != BOOKS["projects"]

# customer -> (time zone, anchor day, book, plan from (local date))
CUSTOMERS = {
    "utc-tokens": ("UTC", 1, "tokens", "2026-11-01"),
    "nyc-tokens": ("America/New_York", 1, "tokens", "2026-11-01"),
    "kol-tasks": ("Asia/Kolkata", 1, "tasks", "2026-11-01"),
    "ktm-projects": ("Asia/Kathmandu", 1, "projects", "2026-11-01"),
    "a31-gpu": ("UTC", 31, "gpu", "2026-10-31"),
}
UNBILLED = "unbilled-co"
GRANT = ("utc-tokens", "2.50")

MODELS = ("m1", "m2", "big")
DEPLOYMENTS = ("d1", "d2")
PROJECTS = (None, "web", "batch")
STATUSES = ("ok", "error", "cancelled")
OUTCOMES = ("succeeded", "failed", "abandoned")


def period_of(customer: str, label: str = LABEL) -> Period:
    timezone, anchor_day = CUSTOMERS[customer][:2] if customer in CUSTOMERS else ("UTC", 1)
    return billing_period(label, timezone, anchor_day)


# ---------------------------------------------------------------- the events


def seeded(ev: Events, customer: str, period: Period) -> list[bytes]:
    """Requests, tasks and usage at seeded instants of the period (to the microsecond)."""
    rng = random.Random(f"golden-{customer}-{period.label}")
    s, e = period.start, period.end

    def instant(margin: timedelta = timedelta(0)) -> datetime:
        return s + rng.randrange((e - s - margin) // US) * US

    out = []
    for _ in range(30):
        input_tokens = rng.randrange(1, 200_000)
        out.append(ev.request(customer, instant(), model=rng.choice(MODELS), deployment=rng.choice(DEPLOYMENTS),
                              status=rng.choices(STATUSES, weights=(8, 1, 1))[0], input_tokens=input_tokens,
                              cached=rng.randrange(input_tokens + 1) if rng.random() < 0.5 else 0,
                              output=rng.randrange(50_000), project=rng.choice(PROJECTS)))
    for k in range(6):  # tasks of one to three attempts, their outcome after the last
        task, start, attempts = f"{customer}-{period.label}-task{k}", instant(3 * HOUR), rng.randint(1, 3)
        model, project = rng.choice(MODELS), rng.choice(PROJECTS)
        for attempt in range(1, attempts + 1):
            out.append(ev.request(customer, start + (attempt - 1) * 10 * MIN, model=model, task_id=task,
                                  attempt=attempt, input_tokens=rng.randrange(1, 20_000), output=rng.randrange(5_000),
                                  project=project))
        out.append(ev.task(customer, task, rng.choice(OUTCOMES), start + attempts * 10 * MIN
                           + rng.randrange(3600) * SECOND))
    for _ in range(4):
        out.append(ev.usage(customer, "tool_calls", str(Decimal(rng.randrange(1, 10**6)).scaleb(-3)), instant()))
    out.append(ev.usage(customer, "verifier_s", str(rng.randrange(1, 40)), instant()))
    return out


def edges(ev: Events, customer: str, period: Period) -> list[bytes]:
    """Events placed by hand on the period's edges: the last microsecond before it, its first, its last,
    and its end (the next period's first)."""
    s, e, c, tag = period.start, period.end, customer, period.label
    return [
        ev.request(c, s - US, output=1_001, project="web"),
        ev.request(c, s, output=1_002, cached=40, input_tokens=90),
        ev.request(c, e - US, output=1_003, project="batch", deployment="d2"),
        ev.request(c, e, output=1_004),
        ev.usage(c, "tool_calls", "0.125", s - US),
        ev.usage(c, "tool_calls", "0.5", s),
        ev.usage(c, "tool_calls", "0.25", e - US),
        ev.usage(c, "tool_calls", "0.0625", e),
        ev.request(c, s - 2 * HOUR, task_id=f"{c}-{tag}-edge-first", output=11),
        ev.task(c, f"{c}-{tag}-edge-first", "succeeded", s),
        ev.request(c, e - HOUR, task_id=f"{c}-{tag}-edge-last", output=12),
        ev.task(c, f"{c}-{tag}-edge-last", "failed", e - US),
        ev.request(c, e - HOUR, task_id=f"{c}-{tag}-edge-next", output=13),
        ev.task(c, f"{c}-{tag}-edge-next", "succeeded", e),
    ]


def month_events(ev: Events) -> list[bytes]:
    out: list[bytes] = []
    for customer in [*CUSTOMERS, UNBILLED]:
        out += seeded(ev, customer, period_of(customer)) + edges(ev, customer, period_of(customer))
    a31_october = period_of("a31-gpu", "2026-10")  # Oct 31 to Nov 30: the anchor-31 customer's November
    out += seeded(ev, "a31-gpu", a31_october) + edges(ev, "a31-gpu", a31_october)
    # America/New_York leaves daylight time on 2026-11-01: 01:30 local twice (05:30 and 06:30 UTC)
    repeated = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    out += [ev.request("nyc-tokens", repeated, output=2_001), ev.request("nyc-tokens", repeated + HOUR, output=2_002)]
    # GPU time of the anchor-31 customer's dedicated replica, one interval across its periods' edge
    edge = a31_october.end
    out += [ev.replica("a31-gpu", edge - 45 * MIN, edge + 30 * MIN, gpus=2),
            ev.replica("a31-gpu", datetime(2026, 11, 9, 8, 20, tzinfo=UTC), datetime(2026, 11, 9, 11, 5, tzinfo=UTC)),
            ev.replica("a31-gpu", datetime(2026, 12, 14, 23, 50, tzinfo=UTC), datetime(2026, 12, 15, 1, 10, tzinfo=UTC),
                       gpus=4)]
    return out


def late_events(ev: Events) -> list[bytes]:
    """Usage of November that arrives after the drafts were made (and before finalization)."""
    return [
        ev.request("utc-tokens", datetime(2026, 11, 15, 12, 0, 0, 1, tzinfo=UTC), model="big", input_tokens=33_333,
                   cached=3_333, output=77_777, project="web"),
        ev.request("ktm-projects", datetime(2026, 11, 20, 3, tzinfo=UTC), model="m2", input_tokens=12_345,
                   output=6_789, project="batch"),
        ev.usage("kol-tasks", "verifier_s", "17", datetime(2026, 11, 21, tzinfo=UTC)),
        ev.request(UNBILLED, datetime(2026, 11, 22, tzinfo=UTC), output=5_000),
    ]


# ---------------------------------------------------------------- the month, captured


@dataclass
class Month:
    captured: dict  # what the golden file holds
    previews: dict[tuple[str, str], dict]
    ungrouped_before: dict  # ktm-projects' preview under the projects book without grouping, before the run
    ungrouped_after: dict  # the same after the late batch
    drafts: list[dict]
    finalized: list[dict]
    events: list[dict]  # every event written, decoded (the independent reference)


def _ingest(url: str, ev: Events, lines: list[bytes], at: datetime) -> None:
    writer = BatchWriter(to_libpq_url(url), group_id="golden", max_bytes=65536, future_tolerance_s=300,
                         clock=lambda: at)
    try:
        result = writer.write(ev.messages(lines))
        assert result.accepted == len(lines), result
    finally:
        writer.close()


def _csv_lines(data: bytes) -> list[str]:
    return data.decode("utf-8").split("\n")


def _invoices(conn) -> list[dict]:
    return [show_invoice(conn, i["id"]) for i in list_invoices(conn)]


@pytest.fixture(scope="module")
def month(pg_server_url, tmp_path_factory) -> Month:
    from fastapi.testclient import TestClient

    from app.api import create_app
    from infermeter.settings import Settings

    url = new_database(pg_server_url)
    clock = {"now": PREVIEW_AT}
    settings = Settings(INFERMETER_HOME=tmp_path_factory.mktemp("golden") / "home", DATABASE_URL=url)
    admin = {"Authorization": f"Bearer {settings.admin_token}"}
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn, \
            TestClient(create_app(settings, url, None, clock=lambda: clock["now"])) as client:
        conn.execute("SET TIME ZONE 'UTC'")
        for customer, (timezone, anchor_day, book, plan_from) in CUSTOMERS.items():
            set_customer(conn, customer, now=SETUP_AT, name=customer, timezone=timezone, anchor_day=anchor_day)
            assign_plan(conn, customer, BOOKS[book], f"{book}.yaml", plan_from, now=SETUP_AT)
        grant = grant_credits(conn, *GRANT, now=SETUP_AT)
        ev = Events("g")
        _ingest(url, ev, month_events(ev), RECEIVED_AT)

        def get(path: str, **params) -> dict:
            answer = client.get(path, params=params, headers=admin)
            assert answer.status_code == 200, (path, params, answer.text)
            return answer.json()

        def usage_reads() -> dict:
            out = {}
            for customer in [*CUSTOMERS, UNBILLED]:
                window = {"from": utc_text(period_of(customer).start), "to": utc_text(period_of(customer).end),
                          "customer_id": customer}
                out[customer] = {
                    "v1_usage": get("/v1/usage", group_by="model,deployment,project", **window),
                    "dashboard_summary": get("/dashboard/data/summary.json", **window),
                }
            return out

        captured: dict = {"periods": {f"{c} {label}": [utc_text(p.start), utc_text(p.end)]
                                      for c in [*CUSTOMERS, UNBILLED] for label in LABELS
                                      for p in [period_of(c, label)]}}

        # before any run: previews (service and dashboard) and usage reads
        previews = {}
        for customer in CUSTOMERS:
            for label in LABELS:
                if customer == "a31-gpu" or label == LABEL:
                    previews[(customer, label)] = preview_invoice(conn, customer, label, now=PREVIEW_AT,
                                                                  cost_model=COST)
        ungrouped_before = preview_invoice(conn, "ktm-projects", LABEL, now=PREVIEW_AT, cost_model=COST,
                                           book=(UNGROUPED, "projects-ungrouped.yaml"))
        captured["previews"] = {f"{c} {label}": p for (c, label), p in previews.items()}
        captured["preview_ungrouped ktm-projects"] = ungrouped_before
        captured["dashboard_current_period_before_run"] = {
            c: get("/dashboard/current-period.json", period=LABEL, customer_id=c) for c in CUSTOMERS}
        captured["usage_reads_before_late"] = usage_reads()

        # the drafting run, customer by customer, then the late batch, then the bulk run that finalizes
        drafting = billing_run(conn, LABEL, now=PREVIEW_AT, bulk=False, grace_h=DRAFT_GRACE_H, cost_model=COST)
        drafts = _invoices(conn)
        captured["run_drafting"] = drafting.to_json()
        captured["invoices_drafted"] = drafts
        _ingest(url, ev, late_events(ev), LATE_AT)
        clock["now"] = FINAL_AT
        final = billing_run(conn, LABEL, now=FINAL_AT, cost_model=COST)
        finalized = _invoices(conn)
        captured["run_final"] = final.to_json()
        captured["invoices_final"] = finalized
        ungrouped_after = preview_invoice(conn, "ktm-projects", LABEL, now=FINAL_AT, cost_model=COST,
                                          book=(UNGROUPED, "projects-ungrouped.yaml"))
        captured["preview_ungrouped_after_late ktm-projects"] = ungrouped_after
        captured["credits utc-tokens"] = credits_view(conn, GRANT[0], now=FINAL_AT)

        # the finance exports (the CSV the CLI writes), now and as known before the late batch
        captured["exports"] = {f"{kind}-{label}.csv": _csv_lines(export(conn, kind, label, "csv"))
                               for label in LABELS for kind in KINDS}
        captured["exports_as_of_before_late"] = {
            f"{kind}-{LABEL}.csv": _csv_lines(export(conn, kind, LABEL, "csv", as_of=PREVIEW_AT)) for kind in KINDS}

        # the dashboards after finalization
        captured["usage_reads_final"] = usage_reads()
        captured["dashboard_invoices"] = {c: get("/dashboard/invoices.json", customer_id=c) for c in CUSTOMERS}
        captured["dashboard_current_period_final"] = {
            c: get("/dashboard/current-period.json", period=LABEL, customer_id=c) for c in CUSTOMERS}

    # the grant's id is random: named by what it is
    captured = json.loads(json.dumps(captured, default=str).replace(grant.id, "<grant utc-tokens>"))
    return Month(captured, previews, ungrouped_before, ungrouped_after, drafts, finalized,
                 [json.loads(line) for line in ev.lines])


def _text(captured: dict) -> str:
    return json.dumps(captured, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- the tests


def test_the_golden_month_gives_what_it_gave(month):
    got = json.loads(_text(month.captured))
    if WRITE_GOLDEN:
        GOLDEN.write_text(_text(month.captured), encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    differences = _differences(want, got)
    assert not differences, (f"{len(differences)} difference(s) from {GOLDEN.name} (golden, now):\n"
                             + "\n".join(differences[:40]))


def _differences(want: object, got: object, path: str = "") -> list[str]:
    """Where two JSON values differ: one line per differing leaf, `path: golden -> now`."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for key in sorted(set(want) | set(got))
                for d in (_differences(want[key], got[key], f"{path}/{key}") if key in want and key in got
                          else [f"{path}/{key}: {want.get(key, '<absent>')!r} -> {got.get(key, '<absent>')!r}"])]
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True)) for d in _differences(w, g, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: {want!r} -> {got!r}"]


def _by_charge(lines: list[dict]) -> dict[tuple, tuple[Decimal, Decimal, int]]:
    """(quantity, amount, lines) per (meter, model, group, kind, service period, unit price): the unit price
    tells apart the charges of one meter and model (by deployment), which a line does not name."""
    out: dict[tuple, tuple[Decimal, Decimal, int]] = defaultdict(lambda: (Decimal(0), Decimal(0), 0))
    for x in lines:
        key = (x["meter"], x["model"], x["group"], x["kind"], x["period"], x["unit_price"])
        q, a, n = out[key]
        out[key] = (q + Decimal(x["quantity"]), a + Decimal(x["amount"]), n + 1)
    return dict(out)


def test_lines_by_project_add_up_to_the_lines_of_the_same_book_without_projects(month):
    grouped_preview = month.previews[("ktm-projects", LABEL)]
    [grouped_final] = [i for i in month.finalized if i["customer_id"] == "ktm-projects"]
    for grouped, ungrouped in ((grouped_preview, month.ungrouped_before), (grouped_final, month.ungrouped_after)):
        assert {x["project"] for x in grouped["lines"]} == {None, "web", "batch"}
        assert {x["project"] for x in ungrouped["lines"]} == {None}
        by_project, whole = _by_charge(grouped["lines"]), _by_charge(ungrouped["lines"])
        assert {k: v[:2] for k, v in by_project.items()} == {k: v[:2] for k, v in whole.items()}
        assert any(n > 1 for _, _, n in by_project.values())  # lines were split
        assert all(n == 1 for _, _, n in whole.values())
        assert grouped["subtotal"] == ungrouped["subtotal"] and grouped["total"] == ungrouped["total"]
    assert grouped_final["subtotal"] != grouped_preview["subtotal"]  # the late batch is on the final invoice


def test_every_invoice_total_is_its_lines_minus_its_credits(month):
    documents = [*month.previews.values(), month.ungrouped_before, month.ungrouped_after, *month.drafts,
                 *month.finalized]
    for d in documents:
        subtotal = sum((Decimal(x["amount"]) for x in d["lines"]), Decimal(0))
        assert Decimal(d["subtotal"]) == subtotal, d["customer_id"]
        assert Decimal(d["total"]) == subtotal - Decimal(d["credits_applied"]), d["customer_id"]
    final = {(i["customer_id"], i["period"]): i for i in month.finalized}
    assert set(final) == {(c, LABEL) for c in CUSTOMERS} | {("a31-gpu", "2026-10")}
    assert {i["status"] for i in month.finalized} == {"open"}
    assert final[("utc-tokens", LABEL)]["credits_applied"] == GRANT[1]
    assert {i["credits_applied"] for k, i in final.items() if k != ("utc-tokens", LABEL)} == {"0.00"}


def reference_quantities(events: list[dict], customer: str, period: Period) -> dict[tuple[str, str], Decimal]:
    """Worked out from the events written, not by the code under test: per (meter, model), the request
    meters of the requests in [start, end) (every status), usage meters summed, and tasks by their
    outcome's time (the latest report of a task counts; abandoned ones bill nothing, the attempts of the
    others are their distinct attempt numbers)."""
    q: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    attempts: dict[str, set[int]] = defaultdict(set)
    outcomes: dict[str, tuple[datetime, str]] = {}
    for e in events:
        data, at = e["data"], datetime.fromisoformat(e["time"])
        if data["customer_id"] != customer:
            continue
        if e["type"] == "infermeter.request.v1":
            if data["task_id"]:
                attempts[data["task_id"]].add(data["attempt"])
            if period.start <= at < period.end:
                model = data["model"]
                q[("uncached_input_tokens", model)] += data["input_tokens"] - data["cached_input_tokens"]
                q[("cached_input_tokens", model)] += data["cached_input_tokens"]
                q[("output_tokens", model)] += data["output_tokens"]
                q[("requests", model)] += 1
        elif e["type"] == "infermeter.usage.v1" and period.start <= at < period.end:
            q[("usage:" + data["meter"], "")] += Decimal(data["quantity"])
        elif e["type"] == "infermeter.task.v1":
            outcomes[data["task_id"]] = max(outcomes.get(data["task_id"], (at, "")), (at, data["outcome"]))
    for task, (at, outcome) in outcomes.items():
        if period.start <= at < period.end and outcome != "abandoned":
            q[({"succeeded": "successful_tasks", "failed": "failed_tasks"}[outcome], "")] += 1
            q[("task_attempts", "")] += len(attempts[task])
    return {k: v for k, v in q.items() if v}


def test_the_invoiced_quantities_are_the_events_of_each_customers_period(month):
    """The golden figures are checked once against a reference that does not use the code under test:
    every invoiced quantity, GPU time worked out by hand."""
    checked = 0
    for invoice in month.finalized:
        customer, label = invoice["customer_id"], invoice["period"]
        invoiced: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for x in invoice["lines"]:
            invoiced[(x["meter"], x["model"])] += Decimal(x["quantity"])
        reference = reference_quantities(month.events, customer, period_of(customer, label))
        billed_meters = {meter for meter, _ in invoiced} - {"gpu_seconds"}
        assert {k: v for k, v in invoiced.items() if k[0] in billed_meters} == \
            {k: v for k, v in reference.items() if k[0] in billed_meters}, (customer, label)
        checked += len(billed_meters)
    assert checked >= 20
    # GPU time by the hours that start in the period (the anchor-31 customer's periods meet at Nov 30
    # 00:00): October has 23:15-24:00 of the interval across the edge at 2 GPUs and Nov 9 08:20-11:05;
    # November the edge interval's 00:00-00:30 at 2 GPUs and Dec 14 23:50 - Dec 15 01:10 at 4
    gpu = {i["period"]: [(x["quantity"], x["amount"]) for x in i["lines"] if x["meter"] == "gpu_seconds"]
           for i in month.finalized if i["customer_id"] == "a31-gpu"}
    assert gpu == {"2026-10": [(str(45 * 60 * 2 + 165 * 60), "17.00")],
                   "2026-11": [(str(30 * 60 * 2 + 80 * 60 * 4), "25.33")]}
