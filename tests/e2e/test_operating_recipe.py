"""docs/operating.md's recipe, run as written: its shell blocks bring the whole stack up on real
servers (Redis, PostgreSQL, Triton serving the shipped router, worker pools, front door), ask one
question through gRPC and stop everything.

The blocks run in one bash, in order, with job control on (as in a terminal: the helpers stop on
SIGINT); the last block, which stops the stack, runs on exit whatever happened. The test only
chooses what the recipe lets an operator choose: the stack's directory, free ports, the suite's
reader (`tests/conftest.py`) and one process per pool.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from infra.local.servers import free_port

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operating.md"
SECTION = "## The whole stack on real servers, from a fresh clone"
BUDGET_S = 240  # about a minute on 2 idle cores; the rest is room for a busy machine
# Variables the recipe reads or exports: none may leak in from the environment running the test.
STACK_VARIABLES = ("DATABASE_URL", "REDIS_URL", "TRITON_GRPC_URL", "TRITON_URL", "OPENSEARCH_URL",
                   "LLM_BASE_URL", "ARAG_RETRIEVER", "ARAG_MODEL_REPOSITORY", "ARAG_KB_DIR")


def recipe_blocks(page: str) -> list[str]:
    """The ```bash blocks of the recipe section, in order."""
    start = page.index(SECTION)
    end = page.find("\n## ", start + len(SECTION))
    section = page[start:end if end != -1 else None]
    return re.findall(r"^```bash\n(.*?)^```$", section, flags=re.DOTALL | re.MULTILINE)


def recipe_script(blocks: list[str]) -> str:
    *steps, stop = blocks
    return "\n".join([
        "set -m -e -o pipefail",
        "stop_stack() {\n" + stop + "}",
        "trap stop_stack EXIT",
        "trap 'exit 143' TERM",
        *steps,
    ])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_recipe_finds_its_blocks():
    blocks = recipe_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    assert "kill" in blocks[-1] and "wait" in blocks[-1], "the last block must stop the stack"


def test_operating_recipe_brings_the_stack_up_and_answers(tmp_path):
    stack = tmp_path / "stack"
    ports = {name: free_port() for name in ("TRITON_GRPC_PORT", "TRITON_HTTP_PORT", "TRITON_METRICS_PORT",
                                             "ARAG_METRICS_PORT", "GRPC_PORT")}
    env = {key: value for key, value in os.environ.items() if key not in STACK_VARIABLES}
    env.update({key: str(port) for key, port in ports.items() if key != "GRPC_PORT"})
    env.update(
        STACK=str(stack), ARAG_GRPC_LISTEN=f"127.0.0.1:{ports['GRPC_PORT']}",
        ARAG_CONCURRENCY=json.dumps({"A": 1, "B": 1, "C": 1, "shadow": 1}),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", PYTHONPATH=str(REPO),
    )
    script = tmp_path / "recipe.sh"
    script.write_text(recipe_script(recipe_blocks(PAGE.read_text(encoding="utf-8"))))
    proc = subprocess.Popen(["bash", str(script)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=BUDGET_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the recipe's stop block runs on the way out
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f"the recipe took longer than {BUDGET_S} s:\n{output[-6000:]}") from None
    logs = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
                     for log in sorted((stack / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{output[-6000:]}\n{logs}"

    assert re.search(r"^answer: \S", output, flags=re.MULTILINE), output
    assert re.search(r"^tier [ABC] \(\w+\), routed by", output, flags=re.MULTILINE), output
    assert "records database: postgresql" in output  # the CLI said where it wrote the key
    triton_log = (stack / "logs" / "triton.log").read_text(errors="replace")
    assert re.search(r"READY model complexity version 1 from .*/model_repository/", triton_log), triton_log
    # everything stopped: no server of the stack listens any more
    server_ports = [int(url.rsplit(":", 1)[1].split("/")[0])
                    for url in ((stack / "redis.url").read_text(), (stack / "postgres.url").read_text())]
    still = [port for port in [*ports.values(), *server_ports] if listening(port)]
    assert not still, f"ports still served after the recipe's stop block: {still}\n{output[-3000:]}"
