"""The customers with metered usage in a window (`customers_with_usage`): whom a billing run looks at
for unbilled usage."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from infermeter.times import Window, floor_hour

# Customers with usage in a window. request_rollup_hourly holds a row per customer x model x deployment
# x hour (3.6M for 10k customers x 5 models x 72 hours of a month): a DISTINCT over the window's rows
# reads them all (0.85 s on bench.billing's month). The rollups' primary keys start with customer_id and
# end with hour, so a loose index scan (a recursive CTE whose each step is the next customer above the
# last one with a row in the window: ORDER BY customer_id LIMIT 1, one descent of the key) costs about
# one descent per customer the table holds instead (0.09 s there; docs/benchmarks.md, "Billing a
# month"). But a step also walks over the rows of customers with none in the window: for one hour of
# that month (5,000 of the 10,000 customers active) the walk took 0.23 s and the plain read 2.5 ms.
# So each rollup table is walked only when the planner's estimate of its rows in the window is at
# least WALK_ROWS_PER_CUSTOMER x its estimated number of customers (pg_stats; no statistics: read).
# task_outcomes has no key on (customer_id, finished_at): its rows of the window are read by
# finished_at (one row per task). gpu_ledger_hourly's customer '' is the shared pool, not a customer.
WALK_ROWS_PER_CUSTOMER = 60  # a descent ~15 us against ~0.25 us a row read (measured on that month)
_ROLLUPS = (("request_rollup_hourly", ">= ''"), ("usage_rollup_hourly", ">= ''"), ("gpu_ledger_hourly", "> ''"))
_NEXT_CUSTOMER = ("SELECT t.customer_id FROM {table} t WHERE t.customer_id {above} AND t.hour >= %(s)s "
                  "AND t.hour < %(e)s ORDER BY t.customer_id LIMIT 1")
_TABLE_CUSTOMERS_SQL = """
SELECT s.tablename, CASE WHEN s.n_distinct < 0 THEN -s.n_distinct * greatest(c.reltuples, 0) ELSE s.n_distinct END
FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename AND c.relnamespace = to_regnamespace(s.schemaname)
WHERE s.schemaname = current_schema() AND s.tablename = ANY(%s) AND s.attname = 'customer_id'
"""


def _walk(name: str, table: str, first: str) -> str:
    """The recursive CTE `name`(customer_id): the customers of `table` with a row in the window, in
    order, then one NULL (the step that found none)."""
    return (f"{name}(customer_id) AS (({_NEXT_CUSTOMER.format(table=table, above=first)}) UNION ALL "
            f"SELECT ({_NEXT_CUSTOMER.format(table=table, above='> ' + name + '.customer_id')}) "
            f"FROM {name} WHERE {name}.customer_id IS NOT NULL)")


def customers_with_usage_sql(walked: Sequence[str]) -> str:
    """The statement of `customers_with_usage`, with the rollup tables in `walked` walked by their key
    and the others read by hour."""
    ctes, parts = [], []
    for i, (table, first) in enumerate(_ROLLUPS):
        pool = " AND customer_id <> ''" if first == "> ''" else ""
        if table in walked:
            ctes.append(_walk(f"w{i}", table, first))
            parts.append(f"SELECT customer_id FROM w{i} WHERE customer_id IS NOT NULL")
        else:
            parts.append(f"SELECT customer_id FROM {table} WHERE hour >= %(s)s AND hour < %(e)s{pool}")
    parts.insert(2, "SELECT customer_id FROM task_outcomes WHERE finished_at >= %(s)s AND finished_at < %(e)s")
    return ("WITH RECURSIVE " + ", ".join(ctes) + " " if ctes else "") + " UNION ".join(parts) + " ORDER BY 1"


def _tables_to_walk(conn: psycopg.Connection, params: dict) -> list[str]:
    customers = dict(conn.execute(_TABLE_CUSTOMERS_SQL, ([t for t, _ in _ROLLUPS],)).fetchall())
    out = []
    for table, _ in _ROLLUPS:
        if not customers.get(table):
            continue
        [[plan]] = conn.execute(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE hour >= %(s)s AND hour < %(e)s",
                                params).fetchall()[0]
        if plan["Plan"]["Plan Rows"] >= WALK_ROWS_PER_CUSTOMER * customers[table]:
            out.append(table)
    return out


# The same question for given customers: a few probes of each table's key per customer.
CUSTOMERS_AMONG_WITH_USAGE_SQL = """
SELECT c FROM unnest(%(ids)s::text[]) AS u(c)
WHERE EXISTS (SELECT 1 FROM request_rollup_hourly t WHERE t.customer_id = u.c AND t.hour >= %(s)s AND t.hour < %(e)s)
   OR EXISTS (SELECT 1 FROM usage_rollup_hourly t WHERE t.customer_id = u.c AND t.hour >= %(s)s AND t.hour < %(e)s)
   OR EXISTS (SELECT 1 FROM task_outcomes t
              WHERE t.customer_id = u.c AND t.finished_at >= %(s)s AND t.finished_at < %(e)s)
   OR EXISTS (SELECT 1 FROM gpu_ledger_hourly t
              WHERE t.customer_id = u.c AND u.c <> '' AND t.hour >= %(s)s AND t.hour < %(e)s)
ORDER BY 1
"""


def customers_with_usage(conn: psycopg.Connection, window: Window, *, among: Sequence[str] | None = None) -> list[str]:
    """Every customer with any metered usage in the UTC hours that overlap [start, end): requests,
    usage meters, task outcomes, or GPU time of a dedicated deployment; sorted. A superset at the edges
    (a whole edge hour counts); callers read the exact quantities with `metering.queries`' reads. `among`:
    only those of these customers (a few key probes each, instead of reading the window)."""
    params: dict = {"s": floor_hour(window.start), "e": window.end}
    if among is not None:
        if not among:
            return []
        params["ids"] = sorted(set(among))
        return [r[0] for r in conn.execute(CUSTOMERS_AMONG_WITH_USAGE_SQL, params).fetchall()]
    return [r[0] for r in conn.execute(customers_with_usage_sql(_tables_to_walk(conn, params)), params).fetchall()]
