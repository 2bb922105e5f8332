"""The instant LLM endpoint: a measurement device, never a default.

An OpenAI-compatible HTTP server (`/v1/chat/completions`, `/v1/completions`) that answers every
prompt with the same short text, at once or after a fixed wait that uses no CPU (a stand-in for a
remote inference endpoint with its own capacity). Benchmarks and load runs put it behind
`LLM_BASE_URL` to measure the serving path without the model's cost; reports name it as such.

`python -m lab.harness.instant_llm --port P [--latency-ms L]` serves it; `InstantLLM` runs that
process (restartable on its port), `running_instant_llm` yields its base URL.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from infra.local.servers import free_port, stop_process

REPO = Path(__file__).resolve().parents[2]
LLM_ANSWER = "Lumora."
READY = "READY instant LLM"


class _InstantLLM(BaseHTTPRequestHandler):
    """POST /v1/chat/completions and /v1/completions: a fixed short answer, at once; GET
    /v1/models: the model list."""

    protocol_version = "HTTP/1.1"  # keep-alive: the workers' HTTP clients reuse connections
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK of the headers on a kept-alive connection: +40 ms per completion (measured).
    disable_nagle_algorithm = True
    # `--llm-latency-ms`: a fixed wait per completion that uses no CPU (a stand-in for a remote
    # inference endpoint with its own capacity); 0, the default, answers at once.
    latency_s = 0.0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.latency_s > 0:
            time.sleep(self.latency_s)  # each request on its own thread: no queueing here
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        prompt = request.get("prompt") or " ".join(
            str(m.get("content", "")) for m in request.get("messages") or [])
        usage = {"prompt_tokens": max(1, len(prompt) // 4), "completion_tokens": 2, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        logprobs = [{"token": LLM_ANSWER, "logprob": -0.01, "bytes": None, "top_logprobs": []}]
        if self.path.rstrip("/").endswith("/chat/completions"):
            choice = {"index": 0, "finish_reason": "stop", "logprobs": {"content": logprobs},
                      "message": {"role": "assistant", "content": LLM_ANSWER}}
            kind = "chat.completion"
        elif self.path.rstrip("/").endswith("/completions"):
            choice = {"index": 0, "finish_reason": "stop", "text": LLM_ANSWER,
                      "logprobs": {"tokens": [LLM_ANSWER], "token_logprobs": [-0.01]}}
            kind = "text_completion"
        else:
            self.send_error(404)
            return
        out = json.dumps({"id": "cmpl-bench", "object": kind, "created": int(time.time()),
                          "model": request.get("model", "instant"), "choices": [choice],
                          "usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        """GET /v1/models: the one model, as a ready OpenAI-compatible server lists it (the
        front door's readiness asks it)."""
        if not self.path.rstrip("/").endswith("/models"):
            self.send_error(404)
            return
        out = json.dumps({"object": "list", "data": [{"id": "instant", "object": "model",
                                                      "owned_by": "lab"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *_: Any) -> None:  # quiet
        pass


def serve_instant_llm(port: int, latency_ms: float = 0.0, host: str = "127.0.0.1") -> int:
    handler = _InstantLLM
    if latency_ms > 0:
        handler = type("_FixedLatencyLLM", (_InstantLLM,), {"latency_s": latency_ms / 1000.0})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"{READY} on port {port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0



class InstantLLM:
    """The endpoint as its own process on a fixed loopback port: `start()` (returns once it
    serves), `stop()`, and `start()` again on the same port, so workers pointed at `url` lose it
    and get it back (a fault a test or the lab injects)."""

    def __init__(self, log_path: Path, latency_ms: float = 0.0, port: int | None = None,
                 host: Any = None) -> None:
        """`host`: an `infra.local.hosts.Host` to run on (listening on its address), else loopback."""
        self.log_path = log_path
        self.latency_ms = latency_ms
        self.port = port or free_port()
        self.host = host
        self.address = host.address if host is not None else "127.0.0.1"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL, for `LLM_BASE_URL`."""
        return f"http://{self.address}:{self.port}/v1"

    def start(self) -> InstantLLM:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("a") as log:
            command = [sys.executable, "-m", "lab.harness.instant_llm", "--port", str(self.port),
                       "--host", self.address, "--latency-ms", str(self.latency_ms)]
            self.proc = subprocess.Popen(
                command if self.host is None else self.host.wrap(command),
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 60
        while READY not in self.log_path.read_text(errors="replace")[offset:]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the instant LLM did not start:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, 10.0)
            self.proc = None

    def __enter__(self) -> InstantLLM:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


@contextmanager
def running_instant_llm(log_path: Path, latency_ms: float = 0.0) -> Iterator[str]:
    """The endpoint as its own process on a free port; yields its base URL (`.../v1`)."""
    with InstantLLM(log_path, latency_ms) as llm:
        yield llm.url


def cpu_model() -> str:
    """The machine's CPU, for benchmark reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="fixed wait per completion, no CPU (default 0: at once)")
    args = parser.parse_args(argv)
    return serve_instant_llm(args.port, args.latency_ms, args.host)


if __name__ == "__main__":
    sys.exit(main())
