"""The replica agent: scrapes one vLLM replica's /metrics and emits infermeter.replica.v1 intervals.

Public API:

    agent = ReplicaAgent(vllm_url, deployment_id, gpu_type, gpu_count, emitter,
                         customer_id=None, replica_id=None, interval_s=10, sample_s=1)
    await agent.run(stop_event)        # until stop_event is set; emits one event per interval
    await agent.sample()               # one scrape (tests)
    agent.close_interval(end) -> dict | None   # the event of the interval ending at `end`
    parse_vllm_metrics(text) -> VllmSample  # pure: Prometheus text -> counters we read

CLI: `infermeter serve replica-agent --vllm URL --deployment D --gpu-type T --gpu-count N
[--customer C] [--interval-s S]` (serving.control_cli.replica_agent).

Each interval [start, end) carries:
- gpu_seconds implied by (end - start) x gpu_count (metering derives it from the interval);
- busy_seconds: the agent samples /metrics every `sample_s` (INFERMETER_REPLICA_SAMPLE_S); the
  span between two consecutive samples counts as busy when either sample shows
  `vllm:num_requests_running > 0` or the prompt/generation token counters advanced between
  them. Resolution = sample_s; a request shorter than that between two idle samples is still
  seen through the counters. busy_seconds <= interval length by construction;
- prompt_tokens / generation_tokens: deltas of `vllm:prompt_tokens_total` and
  `vllm:generation_tokens_total` (summed over their label sets) in the interval. A counter
  that goes down means vLLM restarted: the delta is then the new value (counted from 0).
With `customer_id` the deployment is dedicated and the event's subject/customer_id is that
customer; without, subject "shared-pool" and customer_id null. Event identity:
source `//replica-agent/<replica_id>`, id `<replica_id>/<interval_start>`, so a replayed
interval deduplicates. If a scrape fails the interval still carries its GPU time (the GPUs
were held) with busy time from the samples that succeeded; token deltas catch up at the next
successful scrape.
"""
