"""Run one local server in the foreground on 127.0.0.1 and print its URL:

    python -m infra.local redis|postgres|opensearch [--port N] [--dir DIR]
    python -m infra.local grpc-lb --replica HOST:PORT [--replica HOST:PORT ...] [--port N]
    python -m infra.local hosts --clean

`grpc-lb` is nginx with `grpc_pass` in front of front-door replicas, with active gRPC health
checks (`infra.local.balancer`); it refuses to start, saying why, when no replica is healthy.
`hosts --clean` removes the namespaces and bridges of crashed runs (`infra.local.hosts`).

SIGTERM, SIGINT (Ctrl-C) or SIGHUP stops the server and deletes its temporary directory (a
`--dir` is kept: the next run with the same `--port` and `--dir` serves the same data). The
servers themselves are `infra.local.servers` (Redis, PostgreSQL) and `infra.local.opensearch`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.local.balancer import GrpcBalancer
from infra.local.hosts import remove_stale_networks
from infra.local.opensearch import OpenSearchNode
from infra.local.servers import DURABILITY_OPTIONS, LocalPostgres, LocalRedis, LocalServer, ServerStartError, tail_of


class _StopRequested(Exception):
    """A stop signal reached the helper process."""


def _on_stop_signal(signum: int, _frame: Any) -> None:
    for sig in STOP_SIGNALS:  # one stop: a second signal must not interrupt the clean-up
        signal.signal(sig, signal.SIG_IGN)
    raise _StopRequested(signal.Signals(signum).name)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def make_server(kind: str, port: int | None, workdir: Path | None, args: argparse.Namespace) -> LocalServer:
    if kind == "redis":
        return LocalRedis(workdir, port)
    if kind == "postgres":
        return LocalPostgres(workdir, port, durability=args.durability)
    if kind == "grpc-lb":
        if not args.replica:
            raise SystemExit("grpc-lb needs at least one --replica HOST:PORT")
        return GrpcBalancer(args.replica, workdir, port, startup_timeout_s=args.startup_timeout)
    return OpenSearchNode(workdir, port, heap=args.heap)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.local",
        description="Run a local server in the foreground on 127.0.0.1 and print its URL. SIGTERM, SIGINT or "
                    "SIGHUP stops it and deletes its temporary directory.")
    parser.add_argument("kind", choices=("redis", "postgres", "opensearch", "grpc-lb", "hosts"))
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--dir", type=Path, default=None,
                        help="data directory, kept after exit and reused by the next start "
                             "(default: a temporary one, deleted on exit)")
    parser.add_argument("--durability", choices=sorted(DURABILITY_OPTIONS), default="off",
                        help="postgres: what a commit survives")
    parser.add_argument("--heap", default="1g", help="opensearch: JVM heap (-Xms is half of it)")
    parser.add_argument("--replica", action="append", default=[],
                        help="grpc-lb: a front door's HOST:PORT (repeat for each replica)")
    parser.add_argument("--startup-timeout", type=float, default=10.0,
                        help="grpc-lb: seconds to wait for a replica that says SERVING")
    parser.add_argument("--clean", action="store_true", help="hosts: remove the networks of crashed runs")
    args = parser.parse_args(list(argv))
    if args.kind == "hosts":
        removed = remove_stale_networks()
        print(f"removed networks {removed}" if removed else "no stale network")
        return 0
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    try:
        server = make_server(args.kind, args.port, args.dir, args)
        with server:
            print(server.url, flush=True)
            print(f"{args.kind} (pid {server.pid}) on {server.url}, data in {server.workdir}"
                  f"{'' if args.dir else ' (deleted on exit)'}, log {server.log}", file=sys.stderr, flush=True)
            assert server.proc is not None
            code = server.proc.wait()
            print(f"{args.kind} exited on its own ({code}):\n{tail_of(server.log)}", file=sys.stderr, flush=True)
            return 1
    except _StopRequested:
        return 0
    except ServerStartError as exc:
        print(str(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
