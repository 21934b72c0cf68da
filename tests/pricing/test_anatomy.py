"""The cost anatomy, checked figure by figure against the worked example of docs/cost-model.md, and
its properties on random ledgers and rollups (Hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from pricing.anatomy import (
    CAUSES,
    TERMS,
    AnatomyInputs,
    EngineRecord,
    RequestClassRecord,
    anatomy,
    failures,
    grew_most,
    parts,
)
from pricing.cost import CostModel, attribute
from pricing.money import Currency
from pricing.records import Dataset, GpuRecord, RequestRecord
from tests.examples import examples
from tests.pricing.worked_example import ANATOMY_INPUTS, COST_MODEL, DATASET

D = Decimal


def row(a, key):
    (r,) = [r for r in a.rows if r.key == key]
    return {t: getattr(r, t) for t in TERMS} | {"total": r.total}


def test_worked_example_by_customer():
    a = anatomy(parts(DATASET, COST_MODEL, ANATOMY_INPUTS), "USD", group_by="customer")
    # dep-pool: G 7,200,000 GPU-ms, busy 5,760,000 -> idle 1,440,000 (20%); cache 0.25 x 2,880,000 =
    # 720,000 (10%); queue (5,760,000 - 720,000) x 1,000,000 / 7,000,000 = 720,000 (10%); tokens 60%
    # a's share $4.80: queue and idle 30% = 1.44, cache 0.48, tokens 2.88 over 720k weighted tokens
    # (600k of the rollup + 120k of failover prefill): $0.004 per 1k
    assert row(a, "cust-a") == {
        "new_compute": D("1.32"),  # (240k + 10k + 10k + 70k) x 0.004
        "context_not_reused": D("0.28"),  # (50k + 20k) x 0.004
        "cache_occupancy": D("0.48"),
        "queue_and_idle": D("5.44"),  # 1.44 + the idle dedicated hour 4.00
        "failure": D("1.28"),  # error 80k + cancelled 60k + retried attempt 60k + failovers 2 x 60k = 320k
        "total": D("8.80"),  # = the cost model's cost of cust-a
    }
    # b's share $3.20: 0.96 queue and idle, 0.32 cache, 1.92 tokens over 400k: $0.0048 per 1k
    assert row(a, "cust-b") == {
        "new_compute": D("0.96"), "context_not_reused": D("0"), "cache_occupancy": D("0.32"),
        "queue_and_idle": D("0.96"), "failure": D("0.96"),  # queue timeout 50k + failed task 150k
        "total": D("3.20"),
    }
    assert a.total == D("12.00") == Currency.of("USD").round(attribute(DATASET, COST_MODEL).total_cost)


def test_worked_example_by_deployment():
    a = anatomy(parts(DATASET, COST_MODEL, ANATOMY_INPUTS), "USD", group_by="deployment")
    assert row(a, "dep-pool") == {
        "new_compute": D("2.28"), "context_not_reused": D("0.28"), "cache_occupancy": D("0.80"),
        "queue_and_idle": D("2.40"), "failure": D("2.24"), "total": D("8.00"),
    }
    assert row(a, "dep-a-dedicated")["queue_and_idle"] == row(a, "dep-a-dedicated")["total"] == D("4.00")
    only = anatomy(parts(DATASET, COST_MODEL, ANATOMY_INPUTS), "USD", deployment="dep-pool")
    assert [r.key for r in only.rows] == ["dep-pool"] and only.total == D("8.00")


def test_worked_example_failures_by_cause():
    f = failures(parts(DATASET, COST_MODEL, ANATOMY_INPUTS), "USD")
    assert f.by_cause() == {
        "runtime": (D("0.32"), 1),  # a's upstream error, 80k x 0.004
        "capacity": (D("0.32"), 3),  # b's rejection (0) and queue timeout (0.24); a's evicted prefix (0.08)
        "routing": (D("0.68"), 3),  # a's 2 failover attempts (0.48); a's prefix on another replica (0.20)
        "client": (D("0.24"), 1),  # a's cancelled request
        "model": (D("0.72"), 1),  # b's failed task, no cause given
        "verifier": (D("0.24"), 1),  # a's retried attempt, the verifier's
    }
    assert f.count("capacity", "failure") == 2 and f.count("routing", "failure") == 2
    assert sum(r.cost for r in f.rows) == D("2.24") + D("0.28")  # failure + context not reused
    before = failures(parts(DATASET, COST_MODEL, AnatomyInputs(ANATOMY_INPUTS.engine, ANATOMY_INPUTS.classes[:5])), "USD")
    cause, delta = grew_most(f, before)
    assert (cause, delta) == ("model", D("0.72"))  # no failed task before: model grew by all of it


def test_without_engine_state_or_raw_events_everything_is_new_compute():
    a = anatomy(parts(DATASET, COST_MODEL, AnatomyInputs()), "USD", group_by="customer")
    assert row(a, "cust-a")["new_compute"] == D("4.80") and row(a, "cust-a")["queue_and_idle"] == D("4.00")


# ---------------------------------------------------------------- properties

H0 = datetime(2026, 11, 2, tzinfo=UTC)
deployments = st.sampled_from(["pool", "dep-x"])
hours = st.integers(0, 2).map(lambda h: H0 + timedelta(hours=h))


@st.composite
def ledgers(draw):
    requests = draw(st.lists(st.builds(
        lambda c, m, d, h, n, inp, cached_pct, out: RequestRecord(c, m, d, h, n, inp, inp * cached_pct // 100, out),
        st.sampled_from(["c1", "c2", "c3"]), st.sampled_from(["m1", "m2"]), deployments, hours,
        st.integers(1, 50), st.integers(0, 10**7), st.integers(0, 100), st.integers(0, 10**6)), max_size=12))
    gpu = draw(st.lists(st.builds(
        GpuRecord, st.sampled_from(["", "c1"]), deployments, st.sampled_from(["H100", "L4"]), hours,
        st.integers(0, 3_600_000 * 8)), max_size=8))
    engine = draw(st.lists(st.builds(
        EngineRecord, deployments, hours, st.integers(0, 4 * 10**7).map(Decimal), st.integers(0, 10**8),
        st.integers(0, 10**8), st.integers(0, 10**8)), max_size=6))
    classes = draw(st.lists(st.builds(
        RequestClassRecord, st.sampled_from(["c1", "c2", "c3"]), st.sampled_from(["m1", "m2"]), deployments, hours,
        st.sampled_from(["ok", "error", "cancelled", "rejected"]), st.integers(0, 20), st.integers(0, 10**6),
        st.integers(0, 10**5), error=st.sampled_from(["", "queue_timeout", "upstream_broken"]),
        reason=st.sampled_from(["", "server_shutdown", "client_disconnected"]), wasted_attempt=st.booleans(),
        task_cause=st.sampled_from(["", *CAUSES]), failovers=st.integers(0, 3),
        prefix=st.sampled_from(["", "same", "other"])), max_size=10))
    model = CostModel(gpu_hour={"H100": "2.50", "L4": "0.45"}, prefill_weight=draw(st.sampled_from(["1", "0.5"])),
                      decode_weight=draw(st.sampled_from(["6", "1"])), kv_cache_share=draw(st.sampled_from(["0", "0.3", "1"])))
    return Dataset(H0, H0 + timedelta(hours=3), tuple(requests), tuple(gpu)), model, AnatomyInputs(tuple(engine), tuple(classes))


@given(ledgers(), st.sampled_from(["deployment", "model", "customer"]))
@settings(max_examples=examples(150), deadline=None)
def test_five_terms_are_non_negative_and_add_up_to_the_cost_model_total(case, group_by):
    dataset, model, inputs = case
    ps = parts(dataset, model, inputs)
    a = anatomy(ps, "USD", group_by=group_by)
    assert a.total == Currency.of("USD").round(attribute(dataset, model).total_cost)
    for r in a.rows:
        assert all(getattr(r, t) >= 0 for t in TERMS)
        assert sum(getattr(r, t) for t in TERMS) == r.total
        assert all(getattr(r, t) == getattr(r, t).quantize(D("0.01")) for t in TERMS)
    again = anatomy(parts(dataset, model, inputs), "USD", group_by=group_by)
    assert again.to_json() == a.to_json()  # re-running gives identical output
    f = failures(ps, "USD")
    assert sum(r.cost for r in f.rows) == Currency.of("USD").round(a.exact["failure"] + a.exact["context_not_reused"])


def test_each_books_margin_under_the_anatomy():
    """Per book: how much of the idle loss and of the failure cost customers are billed for, and
    what the platform carries (the worked example, three books)."""
    from pricing.experiments import compare
    from tests.pricing.usage_oracle import oracle_usages
    from tests.pricing.worked_example import GPU_HOUR, PER_TASK, PER_TOKEN

    report = compare(DATASET, [PER_TOKEN, GPU_HOUR, PER_TASK], COST_MODEL, oracle_usages(DATASET, COST_MODEL),
                     ANATOMY_INPUTS)
    assert report.anatomy.total == D("12.00")
    assert report.anatomy.term("queue_and_idle") == D("6.40")  # pool 2.40 + a's idle dedicated hour 4.00
    assert report.anatomy.term("failure") == D("2.24")
    token, gpu, task = ({e.term: e for e in b.anatomy} for b in report.books)
    # GPU-hour ($6/GPU-h): the idle 30% of each pool share and a's idle dedicated hour are billed:
    # a 4320 s x 0.3 + 3600 s, b 2880 s x 0.3 = 5,760 s x 6 / 3600 = $9.60, more than they cost
    assert gpu["queue_and_idle"].billed_to_customers == D("9.60")
    assert gpu["queue_and_idle"].carried_by_platform == D("-3.20")
    assert token["queue_and_idle"].billed_to_customers == task["queue_and_idle"].billed_to_customers == 0
    assert token["queue_and_idle"].carried_by_platform == D("6.40")
    # per task: failed attempts are not successful tasks: the platform carries all of the failure cost
    assert (task["failure"].billed_to_customers, task["failure"].carried_by_platform) == (0, D("2.24"))
    # per token: the customer pays for the failed tokens (a: 4/9 of its tokens' work, b: half)
    assert 0 < token["failure"].billed_to_customers < token["failure"].cost
    # without the failed share of the tokens: a's lines x 5/9 = 0.44 + 0.17 + 0.44, b's x 1/2 = 0.30 + 0.20;
    # 2.90 - 1.55 = 1.35
    assert token["failure"].billed_to_customers == D("1.35")
    # GPU-hour bills the failed GPU time at $6 where it costs $4: 2.24 x 6 / 4
    assert gpu["failure"].billed_to_customers == D("3.36")


def test_a_rejection_by_data_residency_is_a_routing_failure_a_budgets_a_capacity_one():
    from pricing.anatomy import classify

    def rejected(reason: str) -> RequestClassRecord:
        return RequestClassRecord("c", "m", "d", datetime(2026, 11, 2, tzinfo=UTC), "rejected", 3, 0, 0,
                                  reason=reason, failovers=1)

    assert [(term, cause) for term, cause, _, _ in classify(rejected("residency"), COST_MODEL)] == [
        ("failure", "routing"), ("failure", "routing")]  # the rejection, and the try that found its region dead
    assert classify(rejected("budget_exceeded"), COST_MODEL)[0][:2] == ("failure", "capacity")
    assert classify(rejected("rate_limit_requests"), COST_MODEL)[0][:2] == ("failure", "capacity")
