"""Rate limits per customer: requests per minute (RPM) and tokens per minute (TPM).

Public API: used inside `serving.budgets.AdmissionController.admit` (one transaction, under the
customer's budget-row lock), so the gateway only calls `admit`/`settle`. Pure helpers:

    window_start(now) -> datetime                         # the minute [start, start + 60 s)
    sliding_estimate(prev, cur, now) -> float             # previous minute weighted + current
    check(limits, prev_window, cur_window, now, tokens) -> RateDecision
    charge(conn, customer_id, now, tokens)                # +1 request, +tokens in the minute row
    adjust_tokens(conn, customer_id, window_start, delta) # settle: worst case -> actual tokens

Algorithm: sliding-window counter. Counters live in `rate_windows` (customer, minute) in
Postgres, shared by every gateway process; the estimate for the last 60 s is
`previous_minute * (1 - elapsed_fraction) + current_minute`. A request is admitted if
estimate + 1 <= RPM and estimated tokens + (prompt_tokens + max_tokens) <= TPM. TPM charges
the worst case at admission (like OpenAI) and is corrected to the actual tokens at
settlement. Rejections carry Retry-After (seconds until enough of the window slides out).
"""
