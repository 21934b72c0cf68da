"""The cost model and the experiment, checked against the worked example of docs/cost-model.md."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.cost import CostModelError, attribute, cost_per_successful_task, parse_cost_model, task_costs
from pricing.experiments import ExperimentError, compare
from pricing.money import precise
from tests.pricing.usage_oracle import oracle_usages
from tests.pricing.worked_example import COST_MODEL, DATASET, GPU_HOUR, H0, PER_TASK, PER_TOKEN

D = Decimal


def test_gpu_time_is_attributed_by_weighted_tokens():
    att = attribute(DATASET, COST_MODEL)
    # weights: a = 400k + 2 x 100k = 600k, b = 300k + 2 x 50k = 400k -> 60% / 40% of 7200 GPU-s
    by_customer = {}
    for k, s in att.gpu_seconds.items():
        by_customer[(k.customer_id, k.deployment_id)] = s
    assert by_customer == {
        ("cust-a", "dep-pool"): D(4320),
        ("cust-b", "dep-pool"): D(2880),
        ("cust-a", "dep-a-dedicated"): D(3600),  # idle dedicated time is its customer's
    }
    assert att.cost_by(customer="cust-a") == D("8.80")  # 4.80 pool + 4.00 dedicated
    assert att.cost_by(customer="cust-b") == D("3.20")
    assert att.total_cost == D("12.00")
    assert att.cost_per_request("cust-a", "m") == D("0.48")  # 4.80 / 10 requests


def test_caching_off_grows_prefill_time_and_reattributes():
    att = attribute(DATASET, COST_MODEL, caching_off_for=["m"])
    # a's weight 1,000,000 + 200,000 = 1.2M; W' = 1.6M; pool time 7200 x 1.6 = 11520 GPU-s
    # the hour's shares are 80-digit quotients, summed exactly: 9.5999... to the 80th digit (compared at the
    # project scale; the default 28-digit context used to round the sum to 9.60)
    assert precise(att.cost_by(customer="cust-a", model="m")) == D("9.60")
    assert att.cost_by(customer="cust-b", model="m") == D("3.20")  # b had no cached tokens: unchanged


def test_cost_per_successful_task():
    costs = {c.task_id: c for c in task_costs(DATASET.tasks, attribute(DATASET, COST_MODEL), COST_MODEL)}
    # a's served cost per weighted token = 4.80 / 600k = 0.000008
    assert costs["t1"].attempts_cost == D("1.44")  # (120k + 60k) x 0.000008
    assert costs["t1"].retried_attempts_cost == D("0.96")  # attempt 1 only
    assert costs["t1"].tool_cost == D("0.10")  # 2 verification runs x 0.05
    assert costs["t2"].cost == D("0.32")  # 40k x 0.000008
    assert cost_per_successful_task(costs.values()) == D("1.86")  # (1.44 + 0.10 + 0.32) / 1


def test_comparison_of_the_three_books():
    report = compare(DATASET, [PER_TOKEN, GPU_HOUR, PER_TASK], COST_MODEL, oracle_usages(DATASET, COST_MODEL))
    token, gpu, task = report.books
    assert report.cost_total_precise == D("12.1")  # 12.00 GPU + 0.10 verification
    # per token: a = 0.80 + 0.30 + 0.80 = 1.90, b = 0.60 + 0.40 = 1.00
    assert {c.customer_id: c.revenue for c in token.customers} == {"cust-a": D("1.90"), "cust-b": D("1.00")}
    # gpu-hour: a = (4320 + 3600) s x 6 / 3600 = 13.20, b = 2880 s -> 4.80
    assert {c.customer_id: c.revenue for c in gpu.customers} == {"cust-a": D("13.20"), "cust-b": D("4.80")}
    assert {c.customer_id: c.revenue for c in task.customers} == {"cust-a": D("3.00"), "cust-b": D("0")}
    assert gpu.margin == D("18.00") - D("12.10")
    # t1 made two attempts (the smallest number with a retry): one retried attempt, 100k + 2 x 10k weighted tokens x 0.000008
    assert [(b.retries.retried_attempts, b.retries.retried_cost) for b in report.books] == [(1, D("0.96"))] * 3
    assert [c.versus_baseline for c in gpu.customers] == [D("11.30"), D("3.80")]

    # caching gain on model m: cost saving 4.80 under every book
    (g_token,), (g_gpu,), (g_task,) = token.caching, gpu.caching, task.caching
    assert g_token.cost_gain == g_gpu.cost_gain == g_task.cost_gain == D("4.80")
    assert g_token.passed_to_customers == D("0.90")  # 600k cached now at 2/M instead of 0.50/M
    assert g_token.kept_by_platform == D("3.90")
    assert g_gpu.passed_to_customers == D("7.20")  # 4320 extra GPU-s x 6/3600
    assert g_gpu.kept_by_platform == D("-2.40")
    assert (g_task.passed_to_customers, g_task.kept_by_platform) == (D(0), D("4.80"))

    # retries: attempt 1 of t1 cost 0.96; per token the customer pays for its tokens, per task nobody does
    assert token.retries.retried_cost == D("0.96")
    assert token.retries.revenue_from_retries > 0
    assert task.retries.paid_by == "platform"
    assert gpu.retries.revenue_from_retries > 0
    assert report.usage_totals["successful_tasks"] == 1
    assert report.usage_totals["task_attempts"] == 3
    assert report.books[0].risk.buckets[0].start == H0


def test_currency_mismatch_and_missing_gpu_price():
    eur = PER_TASK.model_copy(update={"currency": "EUR"})
    with pytest.raises(ExperimentError, match="one currency"):
        compare(DATASET, [eur], COST_MODEL, oracle_usages(DATASET, COST_MODEL))
    with pytest.raises(CostModelError, match="no \\$/GPU-hour configured for gpu_type 'H100'"):
        attribute(DATASET, COST_MODEL.model_copy(update={"gpu_hour": {"A10": D(1)}}))


def test_cost_model_yaml_errors_name_the_field():
    with pytest.raises(CostModelError, match="cm.yaml: gpu_hour.H100: amount"):
        parse_cost_model("gpu_hour: {H100: 0.0000000000001}\n", "cm.yaml")
    assert parse_cost_model("gpu_hour: {H100: '2.10'}\n").gpu_hour["H100"] == D("2.10")
