"""Budgets: per-customer monthly spend caps (hard or soft) and the admission the gateway asks for.

Public API (the gateway codes against this):

    controller = AdmissionController(engine, settings=None, clock=None)
    result = await controller.admit(
        customer_id, model=..., request_id=..., prompt_tokens=N, max_tokens=M)
    # -> Admission (forward the request; add `result.headers` to the response)
    #    or Rejection (answer result.status with result.openai_error(); add result.headers)
    await controller.settle(
        request_id, input_tokens=..., cached_input_tokens=..., output_tokens=...,
        event_source=..., event_id=...)       # after the request ends, whatever its outcome
    controller.admit_sync(...), controller.settle_sync(...)   # the same, blocking (tests, CLI)

    set_budget(engine, customer_id, monthly_cap=Decimal|None, mode="hard"|"soft", rpm=None, tpm=None)
    get_budget(engine, customer_id) -> BudgetConfig | None
    controller.spend(customer_id) -> Spend   # metered + settled-unmetered + reserved, this month
    list_price(model, settings) -> ListPrice # THE one function that prices tokens for budgets

Types: `Admission(request_id, customer_id, reserved, warning, headers)`;
`Rejection(reason, message, status, error_type, code, headers)` with reason one of
`budget_exceeded` (status 402, type `insufficient_quota`: a budget is not a transient
condition and 429 would make the OpenAI client retry it automatically),
`rate_limit_requests` / `rate_limit_tokens` (status 429, type `rate_limit_exceeded`, with a
`Retry-After` header). `Rejection.openai_error()` is the OpenAI error JSON body.

Soft mode: the request is admitted (and reserved) and the response carries the header
`X-Infermeter-Budget-Warning: monthly budget exceeded: spent 101.23 of 100.00` (WARNING_HEADER).

Spend, this calendar month in UTC ([first of month 00:00Z, next first)):
  metered  = request_rollup_hourly of the month, rated at list price per model
             (uncached input, cached input, output; every status, as metering counts them)
+ settled  = actual costs of finished requests whose event metering has not ingested yet
             (budget_reservations.state='settled' and (event_source, event_id) not in event_keys)
+ reserved = worst cases of requests in flight (state='reserved', not expired).
Both parts come from ONE SQL statement, so they see one snapshot: the instant metering commits
an event (rollup + event_keys in one transaction) its cost moves from `settled` to `metered`,
never counted twice nor missed. Settled rows are deleted once metered (housekeeping).

Worst case of a request = prompt_tokens at the uncached-input list price + max_tokens at the
output list price (the gateway passes the model's context length when the client set no
max_tokens). The cost is Decimal, never float.

Concurrency: every admission of a limited customer runs in one transaction that first locks
the customer's `customer_budgets` row (SELECT ... FOR UPDATE), then computes spend, checks
cap and rate windows, and inserts the reservation. Admissions of one customer are therefore
serialised across all gateway processes: in hard mode spend never passes the cap by more than
the difference between a request's worst case and ... nothing: a request is admitted only if
spend + its worst case <= cap, so the overshoot is 0 (well inside the required "one worst
case"). LiteLLM's races (#34732 check-then-increment without a lock; #36926 spend updated only
after the response) are exactly what the lock + reservation-before-forwarding avoid.
Customers without a budget row are admitted without touching the database (cached for
INFERMETER_BUDGET_CONFIG_TTL_S).
"""
