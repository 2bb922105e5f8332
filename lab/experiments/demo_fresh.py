"""How long does `make demo` take on a fresh clone, and on the second run?

A new user's path, timed end to end: `git clone` of a commit into a new directory, then `make
demo` with an empty `ARAG_CACHE` (no llama.cpp build, no reader GGUF, no wheels) and pip's cache
off, so every download and the one llama.cpp compilation are in the figure; then `make demo`
again in the same clone (the warm machine: nothing may be rebuilt or reinstalled). Every output
line is recorded with its time, so each run splits into its phases: setup (virtualenv, pip, the
reader's GGUF) and the llama.cpp build beside it (`infra/llama/build.sh` reports its compile
time), publishing the router, and the demo itself (`python -m services.demo`: the stack started, the questions
answered, everything stopped). The machine's load average before and after each run and the CPU
seconds the run's processes used say how much of the wall time was contention.

    python -m lab.experiments.demo_fresh --commit HEAD --out reports/setup/fresh-demo

Only the standard library (runs with any Python 3.11 outside the project's venv). Writes
summary.json and one raw record per run (`run-N.jsonl`: every output line with its seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the lines that mark each step (make echoes a recipe line before running it; the llama.cpp build
# reports its own start and end); the demo runs the build beside the installs, so the steps overlap
MARKS = (
    ("venv", re.compile(r"-m venv ")),
    ("pip", re.compile(r"-m pip install -q .*-e \"\.\[")),
    ("reader", re.compile(r"adaptive_rag\.cli reader fetch")),
    ("installed", re.compile(r"touch \S*\.installed")),
    ("llama_build", re.compile(r"llama\.cpp \S+ \(\w+\): one build")),
    ("llama_built", re.compile(r"llama\.cpp \S+ \(\w+\): built in")),
    ("router", re.compile(r"/arag model ship")),
    ("demo", re.compile(r"-m services\.demo")),
)
COMPILED = re.compile(r"llama\.cpp \S+: compiled in (\d+) s")
BUILT = re.compile(r"llama\.cpp \S+ \(\w+\): built in (\d+) s")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_make(clone: Path, env: dict[str, str], target: str, record: Path) -> dict:
    """`make target` in `clone`; every output line with its seconds since the start."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = loadavg()
    start = time.monotonic()
    lines: list[dict] = []
    with record.open("w") as out:
        proc = subprocess.Popen(["make", target], cwd=clone, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            entry = {"t": round(time.monotonic() - start, 3), "line": line.rstrip("\n")}
            lines.append(entry)
            out.write(json.dumps(entry) + "\n")
            sys.stdout.write(f"[{entry['t']:7.1f}] {line}")
        code = proc.wait()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"target": target, "returncode": code, "wall_s": round(wall, 1),
            "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "loadavg_before": load_before, "loadavg_after": loadavg(), **phases(lines, wall)}


def phases(lines: list[dict], wall: float) -> dict:
    """When each step started (seconds from the start of `make`), the build's own compile and
    total seconds, and the split: everything before the demo's own process, and the demo."""
    marks: dict[str, float] = {}
    compiled = built = None
    for entry in lines:
        for name, pattern in MARKS:
            if name not in marks and pattern.search(entry["line"]):
                marks[name] = entry["t"]
        if (m := COMPILED.search(entry["line"])):
            compiled = int(m.group(1))
        if (m := BUILT.search(entry["line"])):
            built = int(m.group(1))
    setup = marks.get("demo", wall)
    return {"marks_s": marks, "before_demo_s": round(setup, 1),
            "demo_s": round(wall - setup, 1) if "demo" in marks else None,
            "llama_compile_s": compiled, "llama_build_s": built}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="what to clone (a ref of this repository)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/arag-fresh-demo"))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/arag-fresh-demo-cache"),
                        help="ARAG_CACHE of the runs: emptied first (never point it at a real cache)")
    parser.add_argument("--runs", type=int, default=2, help="the fresh run, then warm ones")
    parser.add_argument("--pip-cache", action="store_true", help="keep pip's cache (default: off)")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--out", type=Path, default=Path("var/demo-fresh"))
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for make (e.g. LLAMA_BUILD_NICE=0)")
    args = parser.parse_args(argv)

    commit = subprocess.run(["git", "rev-parse", args.commit], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    for path in (args.workdir, args.cache):
        shutil.rmtree(path, ignore_errors=True)
    clone = args.workdir / "repo"
    args.workdir.mkdir(parents=True)
    args.cache.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    clone_start = time.monotonic()
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    clone_s = time.monotonic() - clone_start

    env = {**os.environ, "ARAG_CACHE": str(args.cache)}
    for pair in args.env:
        name, _, value = pair.partition("=")
        env[name] = value
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "LLM_BASE_URL", "LLAMA_SERVER_BIN"):
        env.pop(name, None)
    if not args.pip_cache:
        env["PIP_NO_CACHE_DIR"] = "1"
    runs = []
    for i in range(1, args.runs + 1):
        print(f"--- run {i} ({'fresh' if i == 1 else 'warm'}) ---", flush=True)
        result = run_make(clone, env, args.target, args.out / f"run-{i}.jsonl")
        runs.append({"run": i, "kind": "fresh" if i == 1 else "warm", **result})
        print(json.dumps(runs[-1], indent=1), flush=True)
    summary = {"commit": commit, "target": args.target, "cores": os.cpu_count(), "clone_s": round(clone_s, 1),
               "pip_cache": args.pip_cache, "env": args.env, "runs": runs}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
