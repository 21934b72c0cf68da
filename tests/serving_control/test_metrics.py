"""The serving metrics registry renders what the gateway records, under the documented names."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from serving import metrics


def _samples() -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_requests_tokens_and_rejections_are_counted():
    before = _samples()
    metrics.record_request("m-test", "ok", input_tokens=100, cached_input_tokens=64, output_tokens=7)
    metrics.record_request("m-test", "cancelled", input_tokens=10, output_tokens=2)
    metrics.record_rejection("budget_exceeded")
    after = _samples()

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("infermeter_gateway_requests_total", model="m-test", status="ok") == 1
    assert delta("infermeter_gateway_requests_total", model="m-test", status="cancelled") == 1
    assert delta("infermeter_gateway_tokens_total", model="m-test", kind="input") == 110
    assert delta("infermeter_gateway_tokens_total", model="m-test", kind="cached_input") == 64
    assert delta("infermeter_gateway_tokens_total", model="m-test", kind="output") == 9
    assert delta("infermeter_gateway_rejections_total", reason="budget_exceeded") == 1
    assert metrics.CONTENT_TYPE.startswith("text/plain")


def test_every_documented_name_is_registered():
    names = {family.name for family in text_string_to_metric_families(metrics.render().decode())}
    documented = [line.split("|")[1].strip() for line in metrics.__doc__.splitlines() if line.startswith("| infermeter_")]
    for name in documented:
        assert name.removesuffix("_total") in names, name


def test_a_scrape_recomputes_the_capacity_gauges_at_most_once_a_period(settings):
    """The gateway runs nothing in the background for the capacity gauges: /metrics recomputes them
    when they are a period old (serving/capacity_service.py), and not again within the period."""
    from fastapi.testclient import TestClient

    from serving.capacity_service import CapacityRefresher
    from serving.gateway import create_app
    from serving.upstreams import single_upstream

    class Counted(CapacityRefresher):
        def refresh_once(self) -> list[dict]:
            self.rounds += 1
            return []

    app = create_app(settings, upstreams=single_upstream("m", "http://127.0.0.1:9"))
    refreshers = {
        "hourly": Counted(object(), settings.model_copy(update={"capacity_refresh_s": 3600})),
        "off": Counted(object(), settings.model_copy(update={"capacity_refresh_s": 0})),
    }
    with TestClient(app) as client:
        for refresher in refreshers.values():
            app.state.capacity_refresher = refresher
            for _ in range(3):
                assert client.get("/metrics").status_code == 200
    assert refreshers["hourly"].rounds == 1 and refreshers["off"].rounds == 0
