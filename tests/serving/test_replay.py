"""Mooncake trace replay through the gateway: metered tokens == vLLM's own counters."""

from __future__ import annotations

from app.replay import metered_totals
from serving.replay import load_trace, reconcile, run_replay, scale_trace, trace_path


def test_block_text_is_token_aligned_and_deterministic(vllm):
    import httpx

    from serving.replay import block_text

    assert block_text(7) == block_text(7) != block_text(8)
    prompt = block_text(1) + block_text(2) + block_text(3)
    tokens = httpx.post(
        vllm.url + "/tokenize", json={"model": "tiny-llama", "prompt": prompt}, timeout=30
    ).json()
    assert tokens["count"] == 96  # three blocks of exactly 32 tokens: one KV block each


def test_mooncake_replay_metered_cached_tokens_match_vllm(gateway, customer, pipeline, vllm):
    trace = load_trace(trace_path("mooncake"), limit=60)
    requests = scale_trace(trace, speedup=6.0)
    report = run_replay(
        requests, base_url=gateway.url, model="tiny-llama", vllm_urls=[vllm.url], api_key=customer.token
    )
    assert len(report.ok) == len(requests), [r.error for r in report.results if r.error][:3]
    pairs = reconcile(report, metered_totals(pipeline.database_url, report))
    print(pairs)
    assert pairs["requests"][0] == pairs["requests"][1] == 60
    assert pairs["cached_tokens"][0] == pairs["cached_tokens"][1] > 0
    assert pairs["prompt_tokens"][0] == pairs["prompt_tokens"][1]
    assert pairs["output_tokens"][0] == pairs["output_tokens"][1]
    assert report.client_totals()["cached_tokens"] == pairs["cached_tokens"][0]
