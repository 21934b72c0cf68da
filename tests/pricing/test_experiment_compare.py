"""`pricing.experiments.compare` over a small window worked by hand: three hour buckets, a shared
pool's idle hour, usage meters on the window's edges, a book with a minimum, a book that rates its
own usage (`ExperimentUsages.by_book`), and the refusals with their exact messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pricing.book import price_book_from_data
from pricing.cost import CostModel
from pricing.experiments import ExperimentError, ExperimentUsages, compare
from pricing.records import AttemptRecord, Dataset, GpuRecord, MeterRecord, RequestRecord, TaskRecord
from pricing.usage import Usage, UsageKey

D = Decimal
H0 = datetime(2026, 11, 2, 0, tzinfo=UTC)
H1, H2, H3 = (H0 + timedelta(hours=n) for n in (1, 2, 3))

COST = CostModel(currency="USD", gpu_hour={"A": "3.60"}, usage_unit_cost={"verification_runs": "0.10"})  # $0.001/GPU-s

DATASET = Dataset(
    H0, H3,
    requests=(
        RequestRecord("c1", "m", "d", H0, 1, 100, 0, 0),  # weight 100: all of H0's GPU time
        RequestRecord("c2", "m", "d", H1, 1, 300, 100, 100),  # weight 200 + 100 = 300 (400 with caching off)
    ),
    gpu=(
        GpuRecord("", "d", "A", H0, 1_000_000),  # 1000 s -> c1, $1.00
        GpuRecord("", "d", "A", H1, 2_000_000),  # 2000 s -> c2, $2.00
        GpuRecord("", "d", "A", H2, 500_000),  # idle shared pool: $0.50, the platform's
    ),
    meters=(
        MeterRecord("c1", "verification_runs", H0, D(1)),  # on the window's start: $0.10
        MeterRecord("c2", "verification_runs", H2, D(2)),  # $0.20
        MeterRecord("c9", "verification_runs", H2, D(1)),  # $0.10 of a customer nothing else knows
        MeterRecord("c1", "verification_runs", H3, D(100)),  # on its end: outside
        MeterRecord("c1", "verification_runs", H0 - timedelta(hours=1), D(100)),  # before it: outside
    ),
)

REQ = UsageKey("requests", model="m")
PER_REQUEST = price_book_from_data(
    {"id": "per-request", "currency": "USD", "charges": [{"meter": "requests", "price": {"type": "unit", "amount": "1", "per": 1}}]})
WITH_MINIMUM = price_book_from_data(
    {"id": "minimum", "currency": "USD", "minimum": "5.00",
     "charges": [{"meter": "requests", "price": {"type": "unit", "amount": "2", "per": 1}}]})


def requests(customer: str, n: int) -> Usage:
    return Usage.build(customer, H0, H3, [(REQ, D(n))])


def usages(**extra) -> ExperimentUsages:
    return ExperimentUsages(
        window={"c1": requests("c1", 1), "c2": requests("c2", 3)},
        buckets=[{"c1": requests("c1", 1)}, {"c2": requests("c2", 1)}, {"c2": requests("c2", 2)}],
        caching_off={"m": {"c1": requests("c1", 1), "c2": requests("c2", 4)}},
        **extra,
    )


def test_cost_is_bucketed_by_hour_and_the_window_edges_hold():
    report = compare(DATASET, [PER_REQUEST], COST, usages())
    assert (report.start, report.end, report.currency) == (H0, H3, "USD")
    # GPU 1.00 + 2.00 + 0.50 idle, verification 0.10 (at the start) + 0.20 + c9's 0.10; the meters at
    # the end and before are out. c9 has no usage and no GPU time: its cost counts, it is no customer row
    assert report.cost_total_precise == D("3.900000000000")
    assert report.idle_pool_cost == D("0.50")
    assert report.cost_by_model == {"m": D("3.00")}
    assert report.cost_per_successful_task is None and report.successful_tasks == 0
    assert report.usage_totals == {"requests": D(4)}
    (book,) = report.books
    assert book.book is PER_REQUEST
    assert book.cost == D("3.90")
    assert [(c.customer_id, c.revenue, c.cost, c.baseline_revenue) for c in book.customers] == [
        ("c1", D("1.00"), D("1.10"), D("1.00")), ("c2", D("3.00"), D("2.20"), D("3.00"))]
    assert book.risk.bucket == "hour"
    # the cost of each hour: c1's H0 GPU time and verification, c2's H1 GPU time, the idle pool and the
    # verification of c2 and c9 at H2
    assert [(b.start, b.revenue, b.cost) for b in book.risk.buckets] == [
        (H0, D("1.00"), D("1.10")), (H1, D("1.00"), D("2.00")), (H2, D("2.00"), D("0.80"))]
    # customer margins -0.10 and 0.80: mean 0.35, deviations 0.45
    assert book.risk.customer_margin_stdev == D("0.450000000000")
    assert book.risk.loss_making_customers == 1
    (gain,) = book.caching
    # with caching off c2's 300 weighted tokens become 400: H1's 2000 GPU-s grow to 2666.666666666667
    assert (gain.model, gain.cached_input_tokens) == ("m", 100)
    assert (gain.cost_without_caching, gain.cost_with_caching) == (D("4.17"), D("3.50"))
    assert (gain.revenue_without_caching, gain.revenue_with_caching) == (D("5.00"), D("4.00"))
    assert book.retries.retried_attempts == 0 and book.retries.retried_cost == D("0.00")
    assert book.retries.revenue_from_retries == 0 and book.retries.paid_by == "none"
    assert [(e.term, e.billed_to_customers) for e in book.anatomy] == [("queue_and_idle", 0), ("failure", 0)]


def test_a_books_minimum_tops_up_in_the_last_bucket():
    report = compare(DATASET, [PER_REQUEST, WITH_MINIMUM], COST, usages())
    base, minimum = report.books
    # c1: 1 request x $2 = 2.00, topped up to the 5.00 minimum; c2: 3 x $2 = 6.00, over it
    assert {c.customer_id: (c.revenue, c.baseline_revenue, c.versus_baseline) for c in minimum.customers} == {
        "c1": (D("5.00"), D("1.00"), D("4.00")), "c2": (D("6.00"), D("3.00"), D("3.00"))}
    assert minimum.book is WITH_MINIMUM and base.book is PER_REQUEST
    assert minimum.revenue == D("11.00") and minimum.margin == D("7.10")
    # progressive by bucket: c1 2.00 at H0 and its 3.00 top-up in the last; c2 2.00 at H1, 4.00 more at H2
    assert [b.revenue for b in minimum.risk.buckets] == [D("2.00"), D("2.00"), D("7.00")]
    assert sum(b.revenue for b in minimum.risk.buckets) == minimum.revenue
    assert minimum.risk.loss_making_customers == 0
    assert [c.customer_id for c in minimum.pays_more] == ["c1", "c2"] and minimum.pays_less == []
    assert base.pays_more == [] and base.pays_less == []
    # caching off: c2 4 x $2 = 8.00, c1 still 5.00
    assert (minimum.caching[0].revenue_without_caching, minimum.caching[0].revenue_with_caching) == (D("13.00"), D("11.00"))


def test_a_customer_without_usage_in_the_last_bucket_still_gets_its_minimum():
    u = ExperimentUsages(
        window={"c1": requests("c1", 1), "c2": requests("c2", 3)},
        buckets=[{"c1": requests("c1", 1), "c2": requests("c2", 3)}, {}, {}],
        caching_off={"m": {}},
    )
    report = compare(DATASET, [WITH_MINIMUM], COST, u)
    # c1 2.00 and c2 6.00 at H0; nothing at H1; c1's 3.00 top-up at H2
    assert [b.revenue for b in report.books[0].risk.buckets] == [D("8.00"), D("0"), D("3.00")]
    # caching off, nobody has usage: each pays the minimum
    assert report.books[0].caching[0].revenue_without_caching == D("10.00")


def test_a_book_that_counts_its_own_usage_rates_that_usage():
    own = ExperimentUsages(
        window={"c1": requests("c1", 2), "c3": requests("c3", 1)},  # c3 is only in this book's usage
        buckets=[{"c1": requests("c1", 2)}, {}, {"c3": requests("c3", 1)}],
        caching_off={"m": {"c1": requests("c1", 7)}},
    )
    report = compare(DATASET, [PER_REQUEST, PER_REQUEST], COST, usages(by_book={1: own}))
    shared, counted = report.books
    assert [(c.customer_id, c.revenue) for c in shared.customers] == [("c1", D("1.00")), ("c2", D("3.00")), ("c3", D("0"))]
    assert [(c.customer_id, c.revenue, c.baseline_revenue) for c in counted.customers] == [
        ("c1", D("2.00"), D("1.00")), ("c2", D("0"), D("3.00")), ("c3", D("1.00"), D("0"))]
    assert counted.ratings["c2"].total == 0
    assert {c: r.customer_id for c, r in counted.ratings.items()} == {"c1": "c1", "c2": "c2", "c3": "c3"}
    # margins: c1 1.00 - 1.10 < 0; c3 0 - 0 = 0 exactly, which is no loss
    assert shared.risk.loss_making_customers == 1
    assert [b.revenue for b in counted.risk.buckets] == [D("2.00"), D("0"), D("1.00")]
    assert counted.caching[0].revenue_without_caching == D("7.00")
    # the usage totals are of the shared window
    assert report.usage_totals == {"requests": D(4)}


def test_a_customer_in_the_usage_without_any_cost_share():
    # c3's usage has GPU time and tokens though no GPU time was attributed to it: nothing of it is
    # idle or failure, so nothing is taken off without those terms
    c3 = Usage.build("c3", H0, H3, [(REQ, D(2)), (UsageKey("gpu_seconds", deployment="d", gpu_type="A"), D(10)),
                                    (UsageKey("output_tokens", model="m"), D(10))])
    u = usages()
    u = ExperimentUsages({**u.window, "c3": c3}, u.buckets, u.caching_off)
    report = compare(DATASET, [PER_REQUEST], COST, u)
    (book,) = report.books
    assert [(e.term, e.billed_to_customers) for e in book.anatomy] == [("queue_and_idle", 0), ("failure", 0)]
    assert book.revenue == D("6.00")


def test_money_is_decimal_even_without_customers():
    data = Dataset(H0, H1, requests=(RequestRecord("c1", "m", "d", H0, 1, 10, 0, 0),))  # tokens, no GPU time
    report = compare(data, [PER_REQUEST], COST, ExperimentUsages({}, [{}], {"m": {}}))
    (book,) = report.books
    assert book.customers == []
    values = [book.revenue, book.caching[0].revenue_with_caching, book.caching[0].revenue_without_caching,
              book.retries.revenue_from_retries, *(e.billed_to_customers for e in book.anatomy)]
    assert values == [0] * 6
    assert all(isinstance(v, Decimal) for v in values)


def test_a_window_of_two_days_is_bucketed_by_day():
    end = H0 + timedelta(days=2)
    data = Dataset(H0, end, gpu=(GpuRecord("", "d", "A", H0 + timedelta(days=1, hours=5), 3_600_000),))
    day = Usage.build("c1", H0, end, [(REQ, D(1))])
    u = ExperimentUsages(window={"c1": day}, buckets=[{}, {"c1": day}], caching_off={})
    report = compare(data, [PER_REQUEST], COST, u)
    (book,) = report.books
    assert book.risk.bucket == "day"
    assert [(b.start, b.revenue, b.cost) for b in book.risk.buckets] == [
        (H0, D("0"), D("0.00")), (H0 + timedelta(days=1), D("1.00"), D("3.60"))]
    assert report.idle_pool_cost == D("3.60") and report.cost_by_model == {}
    assert [c.customer_id for c in book.customers] == ["c1"]
    assert book.caching == []


def test_retried_attempts_are_costed_and_taken_off_the_revenue():
    data = Dataset(
        H0, H3,
        requests=(RequestRecord("c1", "m", "d", H0, 4, 400, 0, 0),),
        gpu=(GpuRecord("", "d", "A", H0, 400_000),),  # 400 s = $0.40 for 400 weighted tokens: $0.001 each
        tasks=(
            TaskRecord("c1", "t1", "succeeded", H1, (AttemptRecord(1, 1, 100, 0, 0), AttemptRecord(2, 1, 100, 0, 0),
                                                     AttemptRecord(3, 1, 100, 0, 0))),
            TaskRecord("c1", "t2", "failed", H1, (AttemptRecord(1, 1, 100, 0, 0),)),
            TaskRecord("c1", "t3", "succeeded", H2, ()),
        ),
    )
    window = Usage.build("c1", H0, H3, [(REQ, D(4)), (UsageKey("task_attempts"), D(4))])
    u = ExperimentUsages(window={"c1": window}, buckets=[{"c1": window}, {}, {}],
                         caching_off={"m": {"c1": window}})
    per_attempt = price_book_from_data({"id": "a", "currency": "USD", "charges": [
        {"meter": "task_attempts", "price": {"type": "unit", "amount": "0.25", "per": 1}}]})
    report = compare(data, [PER_REQUEST, per_attempt], COST, u)
    # t1's attempts cost 300 x $0.001 = 0.30 (0.20 retried), t2's 0.10, t3 none: (0.30 + 0.10) / 2 successes
    assert report.cost_per_successful_task == D("0.200000000000")
    assert report.successful_tasks == 2
    requests_book, attempts_book = report.books
    # 2 retried attempts, 200 of the customer's 400 weighted tokens: half of the 4 requests go
    assert (requests_book.retries.retried_attempts, requests_book.retries.retried_cost) == (2, D("0.20"))
    assert requests_book.retries.revenue_from_retries == D("2.00")
    assert requests_book.retries.paid_by == "customers"
    # task attempts: 4 - 2 = 2 without retries, 0.25 each
    assert attempts_book.retries.revenue_from_retries == D("0.50")
    assert attempts_book.retries.paid_by == "customers"


@pytest.mark.parametrize(
    ("books", "cost_model", "u", "message"),
    [
        ([], COST, usages(), "give at least one price book"),
        ([PER_REQUEST, price_book_from_data({"id": "e", "currency": "EUR", "charges": [{"meter": "requests", "price": {"type": "unit", "amount": "1", "per": 1}}]})], COST, usages(),
         "the books and the cost model must share one currency, got EUR, USD"),
        ([PER_REQUEST], CostModel(currency="EUR", gpu_hour={"A": "1"}), usages(),
         "the books and the cost model must share one currency, got EUR, USD"),
        ([PER_REQUEST], COST, ExperimentUsages({}, [{}, {}], {"m": {}}), "expected the usage of 3 hour buckets, got 2"),
        ([PER_REQUEST], COST, ExperimentUsages({}, [{}, {}, {}, {}], {"m": {}}),
         "expected the usage of 3 hour buckets, got 4"),
        ([PER_REQUEST], COST, ExperimentUsages({}, [{}, {}, {}], {}), "no usage with caching off for model(s) m"),
    ],
)
def test_compare_refuses(books, cost_model, u, message):
    with pytest.raises(ExperimentError) as err:
        compare(DATASET, books, cost_model, u)
    assert str(err.value) == message


def test_missing_caching_off_names_every_model():
    data = Dataset(H0, H1, requests=(RequestRecord("c1", "b", "d", H0, 1, 1, 0, 0),
                                     RequestRecord("c1", "a", "d", H0, 1, 1, 0, 0),
                                     RequestRecord("c1", "c", "d", H0, 1, 1, 0, 0)))
    with pytest.raises(ExperimentError) as err:
        compare(data, [PER_REQUEST], COST, ExperimentUsages({}, [{}], {"b": {}}))
    assert str(err.value) == "no usage with caching off for model(s) a, c"
