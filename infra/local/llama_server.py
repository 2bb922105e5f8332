"""One shared LLM inference process: llama.cpp's `llama-server` on loopback.

Every worker process that loads the GGUF through llama-cpp-python competes for the same two cores
with its own copy of the model; one `llama-server` instead runs the model once, with `parallel`
slots decoded together (continuous batching), and the workers reach it through the
OpenAI-compatible adapter (`LLM_BASE_URL=<base_url>`, `LLM_API=completions`): the same shape as
production, where the workers call a vLLM endpoint.

    with LlamaServerProcess(model_path) as server:       # waits until GET /health is ok
        settings = Settings(llm_base_url=server.base_url, llm_api="completions")

    python -m infra.local.llama_server [--port 8081] [--parallel 4] [--threads 2]   # foreground

The binary is built (once, cached) by `infra/llama/build.sh` from the llama.cpp sources vendored
in the llama-cpp-python sdist of the version the project pins, in the same build as the
llama-cpp-python wheel's libraries; `LLAMA_SERVER_BIN` points at another binary instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from infra.local.servers import ServerStartError, free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "infra" / "llama" / "build.sh"
# The llama-cpp-python release whose vendored llama.cpp the server is built from (Makefile:
# LLAMA_CPP_VERSION, pyproject.toml's pin): the server and the embedded model run the same code.
LLAMA_CPP_VERSION = "0.3.36"
# Per slot: the embedded model's default context (Settings.llm_context); the strategies' prompts
# are at most ~2,000 tokens. llama-server splits `ctx_size` evenly over the slots.
CTX_PER_SLOT = 4096
MODEL_ALIAS = "arag-reader"
# Host-memory prompt cache (llama-server's default is up to 8 GiB): a slot's prompt is saved there
# before the slot takes another, so a prompt family whose static prefix no slot holds any more
# (rewrite, decompose, support reader) is restored instead of prefilled. A prompt of this project
# is ~400 tokens, ~11 MiB of Qwen 1.5B's KV: 256 MiB keeps ~20, several per family, and bounds the
# server's memory (the soak saw the 1 GiB cache still filling after 30 minutes). 0 switches it off
# (each slot still reuses its own previous prompt's prefix).
CACHE_RAM_MIB = 256
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
# llama-cpp-python's `Llama` runs without flash attention and with a full-size SWA cache; the
# server's defaults (flash attention "auto" = on, SWA cache cut to the window) change the numerics
# enough that greedy answers differ. Measured on 16 prompts one at a time: 10 equal with the
# defaults, 15 with these (16 with -np 1 or 2). The full SWA cache also lets a slot reuse the
# few-shot header already in its cache (a tier-A request then evaluates ~12 new tokens instead
# of ~66): twice the tier-A throughput. Flash attention off costs up to ~15% on 500-token prompts
# under concurrency (`embedded_parity=False, extra_args=("--swa-full",)` trades parity for it).
PARITY_ARGS = ("--flash-attn", "off", "--swa-full")


def server_binary(version: str = LLAMA_CPP_VERSION, *, build: bool = True) -> Path:
    """The `llama-server` binary: `LLAMA_SERVER_BIN`, else the cached build of `version` (a cache
    hit takes milliseconds), built now with `infra/llama/build.sh` when missing and `build`
    (6-7 minutes on 2 idle cores, once; its progress goes to this process's stderr); without
    `build`, where the cached build's binary is (it may not exist)."""
    explicit = os.environ.get("LLAMA_SERVER_BIN")
    if explicit:
        return Path(explicit)
    env = dict(os.environ)
    # the script calls `python -m pip download`: the interpreter running us (the venv's)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT), version, "llama-server" if build else "dir"], stdout=subprocess.PIPE,
        text=True, env=env, stdin=subprocess.DEVNULL, check=False,
    )
    if proc.returncode != 0:
        raise ServerStartError(f"{BUILD_SCRIPT} {version} failed ({proc.returncode})")
    path = Path(proc.stdout.strip().splitlines()[-1])
    return path if build else path / "bin" / "llama-server"


def default_model_path() -> Path:
    """The configured reader's verified GGUF (`ARAG_GGUF_PATH`, else `ARAG_READER`)."""
    from adaptive_rag.llm import embedded_model_path
    from adaptive_rag.settings import Settings

    return embedded_model_path(Settings())


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class LlamaServerProcess:
    """`llama-server` serving one GGUF on 127.0.0.1 in its own process group.

    A context manager: `start()` on enter (returns once `GET /health` answers 200, i.e. the model
    is loaded), `stop()` on exit (SIGTERM to the group, SIGKILL after `STOP_TIMEOUT_S`).
    `ctx_size` is the total context; each of the `parallel` slots gets `ctx_size // parallel`
    tokens (default `CTX_PER_SLOT` each): a longer prompt is refused with HTTP 400 (the embedded
    model trims it instead). `threads` is the decoding threads of the one process.
    `embedded_parity` (default) runs the model as llama-cpp-python does (`PARITY_ARGS`), so
    greedy answers match the embedded model's.
    """

    def __init__(
        self,
        model_path: Path | str | None = None,
        port: int | None = None,
        parallel: int = 4,
        threads: int = 2,
        ctx_size: int | None = None,
        log_path: Path | str | None = None,
        *,
        binary: Path | str | None = None,
        alias: str = MODEL_ALIAS,
        cache_ram_mib: int = CACHE_RAM_MIB,
        embedded_parity: bool = True,
        extra_args: tuple[str, ...] | list[str] = (),
        start_timeout_s: float = START_TIMEOUT_S,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.model_path = Path(model_path) if model_path else default_model_path()
        self.port = port or free_port()
        self.parallel = parallel
        self.threads = threads
        self.ctx_size = ctx_size or parallel * CTX_PER_SLOT
        self.alias = alias
        self.cache_ram_mib = cache_ram_mib
        self.embedded_parity = embedded_parity
        self.binary = Path(binary) if binary else None
        self.extra_args = list(extra_args)
        self.start_timeout_s = start_timeout_s
        self.extra_env = dict(extra_env or {})  # added to the server's environment (a run marker)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="arag-llama-server-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT` (health, metrics, slots)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, for `LLM_BASE_URL`."""
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        binary = self.binary or server_binary()
        return [
            str(binary), "--model", str(self.model_path), "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(self.parallel), "--threads", str(self.threads),
            "--ctx-size", str(self.ctx_size), "--cont-batching", "--no-webui", "--metrics",
            "--cache-ram", str(self.cache_ram_mib),
            *(PARITY_ARGS if self.embedded_parity else ()),
            *self.extra_args,
        ]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> LlamaServerProcess:
        if self.alive():
            return self
        if not self.model_path.is_file():
            raise ServerStartError(f"GGUF model not found: {self.model_path}")
        command = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches all of it
                env={**os.environ, **self.extra_env},
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise ServerStartError(f"llama-server exited with {code}:\n{_tail(self.log_path)}")
            if self.healthy():
                return self
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(
            f"llama-server not healthy after {self.start_timeout_s:.0f} s:\n{_tail(self.log_path)}"
        )

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def __enter__(self) -> LlamaServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the foreground server like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.local.llama_server",
        description="Run llama-server on 127.0.0.1 in the foreground (Ctrl-C stops it).",
    )
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: the Gemma one)")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--parallel", type=int, default=4, help="slots (default 4)")
    parser.add_argument("--threads", type=int, default=2, help="decoding threads (default 2)")
    parser.add_argument("--ctx-size", type=int, default=None,
                        help=f"total context, split over the slots (default {CTX_PER_SLOT} x slots)")
    parser.add_argument("--log", type=Path, default=None, help="log file (default: a temp file)")
    args = parser.parse_args(argv)
    server = LlamaServerProcess(args.model, args.port, args.parallel, args.threads, args.ctx_size,
                                args.log)
    signal.signal(signal.SIGTERM, _interrupt)
    with server:
        print(f"LLM_BASE_URL={server.base_url} LLM_API=completions  (log: {server.log_path})",
              flush=True)
        try:
            while server.alive():
                time.sleep(1.0)
        except KeyboardInterrupt:
            return 0
    print(f"llama-server exited:\n{_tail(server.log_path)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
