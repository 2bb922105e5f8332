"""The shared inference process: llama.cpp's real `llama-server` serving the embedded Gemma 3 270M
GGUF on loopback (`infra/local/llama_server.py`), reached through the project's OpenAI-compatible
adapter exactly as the workers reach it with `LLM_BASE_URL`.

Nothing is skipped: when the binary is not in the cache yet, the fixture builds it with
`infra/llama/build.sh` (downloads the llama-cpp-python sdist from PyPI and compiles llama.cpp:
6-7 minutes on 2 idle cores the first time, cached under $ARAG_CACHE/llama.cpp afterwards; `make
setup` has already built it), hence the long timeout of this module.

Run: `.venv/bin/python -m pytest tests/integration/test_llama_server.py`
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from adaptive_rag.errors import LLMUnavailableError
from adaptive_rag.llm import build_llm
from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM
from adaptive_rag.prompts import no_retrieval
from adaptive_rag.settings import Settings
from infra.local.llama_server import (
    MODEL_ALIAS,
    LlamaServerProcess,
    default_model_path,
    server_binary,
)

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = (
    "What is the capital of France?",
    "What is the chemical formula of water?",
    "Who painted the Mona Lisa?",
    "What is the largest ocean on Earth?",
)


def tier_a(question: str) -> tuple[str, int, tuple[str, ...]]:
    return (no_retrieval.PROMPT.text(question=question), no_retrieval.PROMPT.max_tokens,
            no_retrieval.PROMPT.stop)


@pytest.fixture(scope="module")
def binary() -> Path:
    path = server_binary()  # builds it (once, cached) when missing
    assert path.is_file() and os.access(path, os.X_OK), path
    return path


@pytest.fixture(scope="module")
def server(binary: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    with LlamaServerProcess(default_model_path(), parallel=4, threads=2, log_path=log,
                            binary=binary) as srv:
        yield srv


def llm_for(base_url: str, **overrides) -> OpenAICompatibleLLM:
    llm = build_llm(Settings(llm_base_url=base_url, llm_api="completions", **overrides))
    assert isinstance(llm, OpenAICompatibleLLM)
    return llm


def test_health_models_and_slots(server: LlamaServerProcess) -> None:
    health = httpx.get(f"{server.url}/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = httpx.get(f"{server.base_url}/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [MODEL_ALIAS]
    slots = httpx.get(f"{server.url}/slots", timeout=5).json()
    assert len(slots) == 4
    assert all(slot["n_ctx"] == server.ctx_size // 4 for slot in slots)


def test_completion_through_build_llm(server: LlamaServerProcess) -> None:
    llm, reading = llm_for(server.base_url), llm_for(server.base_url, llm_logprobs=True)
    try:
        completion = llm.generate(*tier_a("What is the capital of France?"))
        with_logprobs = reading.generate(*tier_a("What is the capital of France?"))
    finally:
        llm.close()
        reading.close()
    assert "Paris" in completion.text
    assert "\n" not in completion.text  # the stop sequence was applied
    assert completion.prompt_tokens > 40 and completion.completion_tokens >= 1
    assert completion.token_logprobs is None  # not asked: nothing reads them
    assert with_logprobs.text == completion.text
    assert with_logprobs.token_logprobs  # asked: llama-server returns them; the adapter keeps them


def test_model_name_is_not_checked(server: LlamaServerProcess) -> None:
    """`LLM_MODEL` does not matter: llama-server answers with its one model whatever the name."""
    llm = llm_for(server.base_url, llm_model="not-the-alias")
    try:
        assert "Paris" in llm.generate(*tier_a("What is the capital of France?")).text
    finally:
        llm.close()


def test_four_concurrent_requests_all_answered(server: LlamaServerProcess) -> None:
    results: dict[int, object] = {}

    def ask(i: int) -> None:
        llm = llm_for(server.base_url)
        try:
            results[i] = llm.generate(*tier_a(QUESTIONS[i]))
        except Exception as exc:  # noqa: BLE001 - reported below
            results[i] = exc
        finally:
            llm.close()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3]
    for i, result in results.items():
        assert not isinstance(result, Exception), f"{QUESTIONS[i]}: {result!r}"
        assert result.text.strip() and result.completion_tokens >= 1, (QUESTIONS[i], result)
    assert "Paris" in results[0].text


def test_clear_error_once_the_server_is_stopped(binary: Path, tmp_path: Path) -> None:
    srv = LlamaServerProcess(default_model_path(), parallel=1, threads=2, binary=binary,
                             log_path=tmp_path / "llama-server.log").start()
    llm = llm_for(srv.base_url, llm_max_retries=1, llm_timeout_s=60.0)  # a busy machine: the refusal after the stop is instant anyway
    try:
        assert llm.generate(*tier_a("What is the capital of France?")).text.strip()
        pid = srv.process.pid
        srv.stop()
        assert not srv.alive()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # the whole process group is gone
        started = time.monotonic()
        with pytest.raises(LLMUnavailableError, match=str(srv.port)):
            llm.generate(*tier_a("What is the capital of France?"))
        assert time.monotonic() - started < 10  # connection refused, one retry: fails fast
    finally:
        llm.close()
        srv.stop()


def test_foreground_entry_point(binary: Path, tmp_path: Path) -> None:
    """`python -m infra.local.llama_server` prints its LLM_BASE_URL and stops on SIGTERM."""
    env = {**os.environ, "LLAMA_SERVER_BIN": str(binary)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.local.llama_server", "--parallel", "1",
         "--log", str(tmp_path / "fg.log")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("LLM_BASE_URL=http://127.0.0.1:"), line
        base_url = line.split()[0].split("=", 1)[1]
        assert httpx.get(base_url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(base_url.removesuffix("/v1") + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
