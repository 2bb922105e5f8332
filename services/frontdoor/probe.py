"""`python -m services.frontdoor.probe [--liveness]`: exit 0 when the local front door's gRPC
health says SERVING, 1 otherwise (an orchestrator's exec probe).

Readiness (the default) follows the dependencies; `--liveness` only asks whether the process
answers (see `stubs.LIVENESS_SERVICE`). Kubernetes' own gRPC probe speaks plaintext only; this one
reads the front door's settings and speaks TLS when the front door does, trusting `--ca` (default:
the client CA under mutual TLS, else the front door's own certificate) and presenting the front
door's certificate as its client certificate under mutual TLS.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.frontdoor.settings import FrontDoorSettings
from services.frontdoor.stubs import LIVENESS_SERVICE


def local_target(listen: str) -> str:
    """The address a probe in the same pod dials for `listen` (a wildcard host becomes loopback)."""
    host, _, port = listen.rpartition(":")
    return f"{'127.0.0.1' if host in ('', '0.0.0.0', '[::]', '::') else host}:{port}"


def check(settings: FrontDoorSettings, liveness: bool = False, timeout_s: float = 3.0,
          ca: Path | None = None) -> str:
    """The health status name the front door reports (UNREACHABLE when it does not answer)."""
    target = local_target(settings.grpc_listen)
    if settings.tls:
        assert settings.tls_cert is not None and settings.tls_key is not None
        mutual = settings.tls_client_ca is not None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(ca or settings.tls_client_ca or settings.tls_cert).read_bytes(),
            private_key=settings.tls_key.read_bytes() if mutual else None,
            certificate_chain=settings.tls_cert.read_bytes() if mutual else None,
        )
        channel = grpc.secure_channel(target, credentials)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE if liveness else ""),
                timeout=timeout_s,
            )
        except grpc.RpcError as exc:
            return f"UNREACHABLE ({exc.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.frontdoor.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--liveness", action="store_true", help="ask only whether the process answers")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    parser.add_argument("--ca", type=Path, help="PEM of the CA that signed the front door's certificate")
    args = parser.parse_args(argv)
    status = check(FrontDoorSettings(), args.liveness, args.timeout, args.ca)
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
