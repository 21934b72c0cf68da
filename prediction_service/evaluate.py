"""The backtest on metered history (`infermeter predict backtest`).

- `backtest_window(conn, start, end)`: the request events of [start, end), each predicted from what was
  metered before it was admitted, the WARMUP_DAYS before `start` included (prediction.backtest).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg

from infermeter.times import Window
from prediction.backtest import BacktestRow, backtest
from prediction_service import history

WARMUP_DAYS = 28


def backtest_window(conn: psycopg.Connection, start: datetime, end: datetime, *, warmup_days: int = WARMUP_DAYS
                    ) -> list[BacktestRow]:
    window = Window(start, end)
    before = history.requests(conn, window.start - timedelta(days=warmup_days), window.start) if warmup_days else []
    return backtest(history.requests(conn, window.start, window.end), before)
