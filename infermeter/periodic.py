"""A job that `infermeter up` runs in the background on a schedule: one daemon thread, started by
`start()` and ended by `stop()`, which sets `stop_event` (the job's loop waits on it between rounds,
so it ends at once) and joins the thread. A job whose `interval_s` is 0 or less is off: `start()`
starts nothing.
"""

from __future__ import annotations

import threading
from typing import Self


class Periodic:
    """Subclasses set `interval_s` and `thread_name` and write `_run()`, a loop that returns once
    `stop_event` is set."""

    thread_name = "periodic"
    interval_s: float

    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
