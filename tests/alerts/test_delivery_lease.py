"""A delivery's POST runs with no transaction open: claimed in one short transaction (attempt time and a
lease), sent, then recorded if the claim still stands. A slow receiver holds no row lock; a second
sender does not send a delivery in flight, takes it over once the lease runs out, and the first
sender's late result does not overwrite the second's. Real PostgreSQL and a real HTTP receiver."""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest

from alerts.delivery import Policy, deliver_due
from alerts.signing import DELIVERY_HEADER
from infermeter.stack.postgres import to_libpq_url
from tests.alerts.conftest import FakeClock
from tests.alerts.test_webhooks import _crossed, _fired, _pending

POLICY = Policy(attempts=6, base_s=1.0, timeout_s=5.0)  # a lease of 65 s


class SlowReceiver:
    """Answers 200 to every POST; the first waits until `release` is set (`arrived` says it came)."""

    def __init__(self) -> None:
        self.arrived, self.release = threading.Event(), threading.Event()
        self.deliveries: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                first = not receiver.deliveries
                receiver.deliveries.append(self.headers[DELIVERY_HEADER])
                if first:
                    receiver.arrived.set()
                    receiver.release.wait(30)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slow():
    receiver = SlowReceiver()
    yield receiver
    receiver.close()


def _sender(db_url: str, clock: FakeClock, results: list) -> threading.Thread:
    def run() -> None:
        with psycopg.connect(to_libpq_url(db_url), autocommit=True) as own:
            results.append(deliver_due(own, POLICY, now=clock(), clock=clock))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _row(conn, delivery: str) -> tuple:
    return conn.execute("SELECT status, attempts, last_attempt_at, next_attempt_at, last_status FROM alert_deliveries "
                        "WHERE delivery_id = %s", (delivery,)).fetchone()


def test_a_slow_receiver_holds_no_lock_on_the_delivery(db_url, conn, budgets, spender, slow):
    _crossed(conn, spender, slow.url, "50.00")
    _fired(conn, budgets)
    [delivery] = _pending(conn)
    clock, results = FakeClock(), []
    sender = _sender(db_url, clock, results)
    try:
        assert slow.arrived.wait(10)
        # the POST is in flight and the row is not locked: another transaction locks and updates it at once ...
        with psycopg.connect(to_libpq_url(db_url)) as other:
            other.execute("SET lock_timeout = '1s'")
            assert other.execute("SELECT delivery_id FROM alert_deliveries WHERE delivery_id = %s FOR UPDATE NOWAIT",
                                 (delivery,)).fetchone() == (delivery,)
            assert other.execute("UPDATE alert_deliveries SET body = body WHERE delivery_id = %s",
                                 (delivery,)).rowcount == 1
            other.commit()
        # ... and it is claimed: this attempt's time, due again when the lease ends
        assert _row(conn, delivery) == ("pending", 0, clock(), clock() + timedelta(seconds=65), None)
        # a second sender does not send a delivery in flight
        assert deliver_due(conn, POLICY, now=clock(), clock=clock) == []
        assert deliver_due(conn, POLICY, now=clock() + timedelta(seconds=64), clock=clock) == []
    finally:
        slow.release.set()
        sender.join(30)
    [[attempt]] = results
    assert (attempt.delivery_id, attempt.attempt, attempt.status, attempt.outcome) == (delivery, 1, 200, "delivered")
    assert _row(conn, delivery) == ("delivered", 1, clock(), None, 200)
    assert slow.deliveries == [delivery]  # sent once


def test_a_lease_run_out_is_taken_over_and_the_late_result_does_not_overwrite_it(db_url, conn, budgets, spender,
                                                                               slow):
    _crossed(conn, spender, slow.url, "50.00")
    _fired(conn, budgets)
    [delivery] = _pending(conn)
    first, results = FakeClock(), []
    sender = _sender(db_url, first, results)
    try:
        assert slow.arrived.wait(10)
        second = FakeClock()
        second.now = first.now + timedelta(seconds=65)  # the lease has run out: the first sender is presumed dead
        [taken_over] = deliver_due(conn, POLICY, now=second(), clock=second)
        assert (taken_over.attempt, taken_over.outcome) == (1, "delivered")
    finally:
        slow.release.set()
        sender.join(30)
    assert results == [[]]  # the first sender's answer came too late to count
    assert _row(conn, delivery) == ("delivered", 1, second(), None, 200)
    assert slow.deliveries == [delivery, delivery]  # at least once: the same id, recognised by the receiver
