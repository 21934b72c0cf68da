"""`pricing.anatomy.parts`, `anatomy` and `failures` on small ledgers worked by hand, part by part:
engine records and rollup rows summed per deployment-hour, every kind of share (an idle dedicated
hour, a share of new compute only, one with wasted work, one with failures only, one whose classes
weigh nothing), and the rows and failure rows to the cent with their exact keys and order."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext

import pytest

from pricing.anatomy import AnatomyInputs, EngineRecord, FailureRow, Part, anatomy, failures, parts
from pricing.anatomy import RequestClassRecord as C
from pricing.cost import CostModel, attribute
from pricing.money import EXACT
from pricing.records import Dataset, GpuRecord
from pricing.records import RequestRecord as R

D = Decimal
H = datetime(2026, 2, 1, 10, tzinfo=UTC)
END = datetime(2026, 2, 1, 11, tzinfo=UTC)
MODEL = CostModel(gpu_hour={"h100": D("3.60")})  # $0.001 a GPU-second, prefill and decode weigh 1, kv share 0.3

# d1 (the shared pool): 3,600,000 GPU-ms = $3.60 over weighted tokens a 300k (two rollup rows of 150k),
# b 100k, c 100k: a $2.16, b $0.72, c $0.72. d2: an idle hour of 1,000,000 GPU-ms dedicated to d, $1.00.
DATASET = Dataset(
    H, END,
    requests=(R("a", "m", "d1", H, 10, 200_000, 100_000, 50_000), R("a", "m", "d1", H, 10, 100_000, 0, 50_000),
              R("b", "m", "d1", H, 5, 100_000, 0, 0), R("c", "m", "d1", H, 2, 100_000, 0, 0)),
    gpu=(GpuRecord("", "d1", "h100", H, 3_600_000), GpuRecord("d", "d2", "h100", H, 1_000_000)),
)
# d1's engines in two records: busy 2,880,000 of 3,600,000 (idle 720,000); cache 0.3 x 1,200,000 = 360,000
# (10%); queued (2,880,000 - 360,000) x 200 / 800 = 630,000: queue and idle 1,350,000 (37.5%), tokens 52.5%
ENGINE = (EngineRecord("d1", H, D(2_000_000), 1_000_000, 100, 300), EngineRecord("d1", H, D(880_000), 200_000, 100, 300))
CLASSES = (
    C("a", "m", "d1", H, "ok", 18, 160_000, 80_000),  # new compute 240k, 18 requests
    C("a", "m", "d1", H, "error", 1, 20_000, 0),  # failure runtime 20k
    C("a", "m", "d1", H, "error", 1, 10_000, 10_000),  # failure runtime 20k more
    C("a", "m", "d1", H, "ok", 1, 10_000, 0, failovers=2),  # new compute 10k; failure routing 2 x 10k, 2 attempts
    C("a", "m", "d1", H, "ok", 1, 30_000, 0, prefix="other"),  # context not reused (routing) 30k; new compute 0
    C("b", "m", "d1", H, "ok", 5, 100_000, 0),
    C("b", "m", "d1", H, "ok", 2, 0, 0),
    C("c", "m", "d1", H, "cancelled", 2, 100_000, 0),  # failure client 100k: c's whole token work
)


def part(customer, term, cause, amount, units=0, model="m", deployment="d1"):
    return Part(customer, model, deployment, H, term, cause, D(amount), units)


def test_parts_of_every_kind_of_share():
    assert parts(DATASET, MODEL, AnatomyInputs(ENGINE, CLASSES)) == [
        # a: $2.16 = 0.81 queue and idle + 0.216 cache + 1.134 tokens; the tokens over 320k: new compute
        # 300k - (90k wasted - 20k failover extras) = 230k, failure runtime 40k, routing 20k, context 30k
        part("a", "queue_and_idle", "", "0.81"),
        part("a", "cache_occupancy", "", "0.216"),
        part("a", "context_not_reused", "routing", "0.1063125", 1),  # 1.134 x 30 / 320
        part("a", "failure", "routing", "0.070875", 2),  # 1.134 x 20 / 320
        part("a", "failure", "runtime", "0.14175", 2),  # 1.134 x 40 / 320
        part("a", "new_compute", "", "0.8150625", 19),  # 1.134 x 230 / 320; 18 + 1 + 0 requests
        # b: new compute only (7 requests): all its token work, 0.72 x 52.5%
        part("b", "queue_and_idle", "", "0.27"),
        part("b", "cache_occupancy", "", "0.072"),
        part("b", "new_compute", "", "0.378", 7),
        # c: failures only: all its token work is the failure, new compute none
        part("c", "queue_and_idle", "", "0.27"),
        part("c", "cache_occupancy", "", "0.072"),
        part("c", "failure", "client", "0.378", 2),
        part("c", "new_compute", "", "0", 0),
        # d2: the idle hour of the deployment dedicated to d
        part("d", "queue_and_idle", "", "1.00", model="", deployment="d2"),
    ]


def test_a_share_whose_classes_weigh_nothing_is_all_new_compute():
    # caching off for m: a's fully cached prompts weigh 100 in the scenario and nothing in the rollup, so
    # the hour grows by (100 + 100) / 100 to $7.20, $3.60 a share; a's one error request weighs nothing
    # either (no engine records: all token work)
    ds = Dataset(H, END, requests=(R("a", "m", "d3", H, 1, 100, 100, 0), R("b", "m", "d3", H, 1, 100, 0, 0)),
                 gpu=(GpuRecord("", "d3", "h100", H, 3_600_000),))
    inputs = AnatomyInputs(classes=(C("a", "m", "d3", H, "error", 1, 0, 0),))
    got = parts(ds, MODEL, inputs, attribute(ds, MODEL, caching_off_for=["m"]))
    assert got == [
        part("a", "queue_and_idle", "", "0", deployment="d3"),
        part("a", "cache_occupancy", "", "0", deployment="d3"),
        part("a", "failure", "runtime", "0", 1, deployment="d3"),
        part("a", "new_compute", "", "3.60", deployment="d3"),
        part("b", "queue_and_idle", "", "0", deployment="d3"),
        part("b", "cache_occupancy", "", "0", deployment="d3"),
        part("b", "new_compute", "", "3.60", deployment="d3"),
    ]


# ---------------------------------------------------------------- anatomy


def test_anatomy_refuses_an_unknown_grouping():
    with pytest.raises(ValueError) as raised:
        anatomy([], "USD", group_by="gpu")
    assert str(raised.value) == "group by one of deployment, model, customer, not 'gpu'"


def test_anatomy_sums_the_parts_of_each_row_and_term():
    all_parts = [part("a", "new_compute", "", "1.006"), part("a", "new_compute", "", "0.500"),
                 part("a", "failure", "runtime", "0.25"), part("b", "failure", "client", "0.244"),
                 part("d", "queue_and_idle", "", "1.00", model="", deployment="d2")]
    a = anatomy(all_parts, "USD", group_by="customer")
    assert (a.currency, a.group_by) == ("USD", "customer")
    assert a.exact == {"new_compute": D("1.506"), "context_not_reused": D("0"), "cache_occupancy": D("0"),
                       "queue_and_idle": D("1.00"), "failure": D("0.494")}
    # 3.000 split over a 1.756, b 0.244, d 1.00 to the cent by largest remainder: 1.76 + 0.24 + 1.00;
    # a's 1.76 over new compute 1.506 and failure 0.25: 1.51 + 0.25
    assert [(r.key, r.new_compute, r.failure, r.queue_and_idle, r.total) for r in a.rows] == [
        ("a", D("1.51"), D("0.25"), D("0.00"), D("1.76")),
        ("b", D("0.00"), D("0.24"), D("0.00"), D("0.24")),
        ("d", D("0.00"), D("0.00"), D("1.00"), D("1.00")),
    ]
    only_d1 = anatomy(all_parts, "USD", deployment="d1")
    assert (only_d1.group_by, [r.key for r in only_d1.rows], only_d1.total) == ("deployment", ["d1"], D("2.00"))
    assert anatomy([], "JPY").rows == () and anatomy([], "JPY").currency == "JPY"


# ---------------------------------------------------------------- failures


def test_failures_by_cause_in_the_causes_order_then_kind_model_customer():
    all_parts = [
        part("b", "failure", "routing", "0.10", 1),
        part("a", "context_not_reused", "routing", "0.20", 3),
        part("a", "failure", "capacity", "0.30", 1),
        part("a", "failure", "runtime", "0.25", 1),
        part("a", "failure", "runtime", "0.25", 2),  # the same key: 0.50, 3 requests
        part("a", "failure", "client", "0", 4),  # requests that cost nothing are kept
        part("a", "new_compute", "", "9.99", 9),  # not a failure
    ]
    f = failures(all_parts, "EUR")
    assert f.currency == "EUR"
    assert f.rows == (
        FailureRow("runtime", "failure", "m", "a", D("0.50"), 3),
        FailureRow("capacity", "failure", "m", "a", D("0.30"), 1),
        FailureRow("routing", "context_not_reused", "m", "a", D("0.20"), 3),
        FailureRow("routing", "failure", "m", "b", D("0.10"), 1),
        FailureRow("client", "failure", "m", "a", D("0.00"), 4),
    )
    assert failures([part("a", "failure", "model", "0", 0)], "USD").rows == ()


# ---------------------------------------------------------------- exact to 80 digits, not 28


def test_parts_are_exact_beyond_the_default_28_digits():
    # $1.00 of token work (1,000,000 GPU-ms, no engine records) over 300k weighted tokens, 100k of them an
    # error: a third and two thirds, to EXACT's 80 digits
    ds = Dataset(H, END, requests=(R("a", "m", "d1", H, 3, 300_000, 0, 0),),
                 gpu=(GpuRecord("", "d1", "h100", H, 1_000_000),))
    got = parts(ds, MODEL, AnatomyInputs(classes=(C("a", "m", "d1", H, "error", 1, 100_000, 0),)))
    with localcontext(EXACT):
        third = D(1) / 3
        assert [(p.term, p.amount) for p in got[2:]] == [("failure", third), ("new_compute", D(2) / 3)]
        assert len(str(third)) == 82  # "0." and 80 threes: 28 would not do


def test_anatomy_and_failures_sum_exactly_beyond_28_digits():
    tiny = "0.004999999999999999999999999999999"  # 31 significant digits: half a cent, less 10^-33
    a = anatomy([part("a", "failure", "runtime", "1"), part("a", "failure", "runtime", tiny)], "USD")
    assert a.exact["failure"] == D("1.004999999999999999999999999999999")
    assert a.total == D("1.00")  # rounded once, exactly: not up to 1.01
    assert failures([part("a", "failure", "runtime", tiny, 1)], "USD").rows == (
        FailureRow("runtime", "failure", "m", "a", D("0.00"), 1),)


# A GPU cost on a half cent ($91.115: 91,115,000 GPU-ms at $0.001 a GPU-second), split into parts by
# divisions that do not end (engine fractions, 1/9 and 7/9 of the token work): 80-digit parts summed
# to 91.1149...9 and the anatomy said $91.11 where the cost model (and `pricing compare`) say $91.12.
# Then the same cost shared by three customers (the shares themselves inexact).
HALF = Dataset(H, END, requests=(R("b", "m", "d1", H, 3, 9_000, 0, 0),), gpu=(GpuRecord("", "d1", "h100", H, 91_115_000),))
HALF_ENGINE = (EngineRecord("d1", H, D(53_974_167), 37_789_669, 0, 2),)
HALF_CLASSES = (C("b", "m", "d1", H, "ok", 1, 1_000, 0), C("b", "m", "d1", H, "error", 1, 7_000, 0),
                C("b", "m", "d1", H, "cancelled", 1, 1_000, 0))
SHARED = Dataset(H, END, requests=(R("c", "m", "d1", H, 3, 16_000, 0, 0), R("b", "m", "d1", H, 3, 17_000, 0, 0),
                                   R("a", "m", "d1", H, 1, 9_000, 0, 0)),
                 gpu=(GpuRecord("", "d1", "h100", H, 95_475_000),))
SHARED_CLASSES = (C("c", "m", "d1", H, "ok", 1, 7_000, 0), C("c", "m", "d1", H, "error", 1, 5_000, 0),
                  C("c", "m", "d1", H, "cancelled", 1, 4_000, 0), C("b", "m", "d1", H, "ok", 1, 5_000, 0),
                  C("b", "m", "d1", H, "error", 1, 9_000, 0), C("b", "m", "d1", H, "cancelled", 1, 3_000, 0),
                  C("a", "m", "d1", H, "ok", 1, 9_000, 0))


@pytest.mark.parametrize(("dataset", "inputs", "total"), [
    (HALF, AnatomyInputs(HALF_ENGINE, HALF_CLASSES), D("91.12")),
    (SHARED, AnatomyInputs((), SHARED_CLASSES), D("95.48")),
])
def test_a_cost_on_a_half_cent_is_the_same_cent_in_every_total(dataset, inputs, total):
    from pricing.book import price_book_from_data
    from pricing.experiments import ExperimentUsages, compare, experiment_buckets
    from pricing.money import Currency, exact_sum

    attribution = attribute(dataset, MODEL)
    ps = parts(dataset, MODEL, inputs, attribution)
    # each share's parts add up to it to the last digit
    for k, cost in attribution.cost.items():
        assert exact_sum(p.amount for p in ps if (p.customer_id, p.model, p.deployment_id, p.hour)
                         == (k.customer_id, k.model, k.deployment_id, k.hour)) == cost
    assert Currency.of("USD").round(attribution.total_cost) == total  # half-up
    for group_by in ("deployment", "model", "customer"):
        assert anatomy(ps, "USD", group_by=group_by).total == total
    assert anatomy(ps, "USD", deployment="d1").total == total
    assert sum(r.cost for r in failures(ps, "USD").rows) == Currency.of("USD").round(
        exact_sum(p.amount for p in ps if p.term in ("failure", "context_not_reused")))
    # `pricing compare` costs the same usage to the same cent
    book = price_book_from_data({"id": "per-request", "currency": "USD",
                                 "charges": [{"meter": "requests", "price": {"type": "unit", "amount": "1", "per": 1}}]})
    _, buckets = experiment_buckets(dataset.start, dataset.end)
    report = compare(dataset, [book], MODEL, ExperimentUsages({}, [{} for _ in buckets], {"m": {}}), inputs)
    assert report.books[0].cost == total
