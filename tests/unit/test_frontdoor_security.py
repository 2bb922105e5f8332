"""The front door's wire through real gRPC clients on loopback: TLS with a certificate made here
(plaintext refused), mutual TLS (no client certificate refused), reflection switchable off, the
request size bound to the query limit, and API keys never written to any log or span."""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import json
import logging
import time
from pathlib import Path

import grpc
import pytest
import test_frontdoor
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from frontdoor_fakes import FakeStore
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from otel_support import recorded
from test_frontdoor import LIBRARY, Harness, make_settings, status_of

from adaptive_rag.contracts import CallError, Principal
from adaptive_rag.logs import configure_logging
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from services.frontdoor.server import request_limits
from services.frontdoor.stubs import SERVICE_NAME, pb2, pb2_grpc

# --- certificates ----------------------------------------------------------------------------------


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool = False, server: bool = False):
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A test CA, a server certificate for localhost / 127.0.0.1 and a client certificate."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    files = {"ca.pem": _certificate("arag test CA", ca_key, "arag test CA", ca_key, ca=True)}
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{role}.pem"] = _certificate(f"arag {role}", key, "arag test CA", ca_key, server=role == "server")
        files[f"{role}.key"] = _pem(key)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return {name.replace(".", "_"): folder / name for name in files}


def secure_stub(port: int, pki: dict[str, Path], client_cert: bool) -> tuple[grpc.Channel, pb2_grpc.AdaptiveRagStub]:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["ca_pem"].read_bytes(),
        private_key=pki["client_key"].read_bytes() if client_cert else None,
        certificate_chain=pki["client_pem"].read_bytes() if client_cert else None,
    )
    channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials)
    return channel, pb2_grpc.AdaptiveRagStub(channel)


def ask(stub: pb2_grpc.AdaptiveRagStub) -> pb2.AnswerReply:
    return stub.Answer(pb2.AnswerRequest(query_text="What is 2+2?"), metadata=test_frontdoor.AUTH, timeout=5)


# --- TLS -------------------------------------------------------------------------------------------


def test_tls_answers_and_plaintext_is_refused(pki):
    harness = Harness(make_settings(tls_cert=pki["server_pem"], tls_key=pki["server_key"]))
    try:
        channel, stub = secure_stub(harness.running.port, pki, client_cert=False)
        with channel:
            assert ask(stub).answer == "answer to What is 2+2?"
        with grpc.insecure_channel(f"127.0.0.1:{harness.running.port}") as plain:
            error = status_of(ask, pb2_grpc.AdaptiveRagStub(plain))
        assert error.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        harness.close()


def test_mutual_tls_needs_a_client_certificate_signed_by_the_ca(pki):
    harness = Harness(make_settings(tls_cert=pki["server_pem"], tls_key=pki["server_key"],
                                    tls_client_ca=pki["ca_pem"]))
    try:
        without, stub = secure_stub(harness.running.port, pki, client_cert=False)
        with without:
            assert status_of(ask, stub).code() is grpc.StatusCode.UNAVAILABLE
        with_cert, stub = secure_stub(harness.running.port, pki, client_cert=True)
        with with_cert:
            assert ask(stub).answer == "answer to What is 2+2?"
    finally:
        harness.close()


def test_tls_settings_come_in_pairs(pki):
    with pytest.raises(ValueError, match="go together"):
        make_settings(tls_cert=pki["server_pem"])
    with pytest.raises(ValueError, match="needs ARAG_TLS_CERT"):
        make_settings(tls_client_ca=pki["ca_pem"])


# --- reflection ------------------------------------------------------------------------------------


def list_services(harness: Harness) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(harness.channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                        timeout=5)
    return [s.name for reply in replies for s in reply.list_services_response.service]


@pytest.mark.parametrize("enabled", [True, False])
def test_reflection_can_be_switched_off(enabled):
    harness = Harness(make_settings(grpc_reflection=enabled))
    try:
        if enabled:
            assert SERVICE_NAME in list_services(harness)
        else:
            error = status_of(list_services, harness)
            assert error.code() is grpc.StatusCode.UNIMPLEMENTED
        assert harness.answer("What is 2+2?")[0].answer == "answer to What is 2+2?"
    finally:
        harness.close()


# --- request size ----------------------------------------------------------------------------------


def test_the_request_size_follows_the_query_limit():
    harness = Harness(make_settings())
    limit = request_limits(LIBRARY.max_query_chars)[f"/{SERVICE_NAME}/Answer"]
    try:
        # the longest query of 4-byte characters still reaches the precise validation
        assert harness.answer("😀" * LIBRARY.max_query_chars)[0].answer
        over = status_of(harness.answer, "x" * (LIBRARY.max_query_chars + 1))
        assert test_frontdoor.told(over, CallError.QUERY_TOO_LONG)
        huge = status_of(harness.answer, "x" * (limit + 1))
        assert huge.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert test_frontdoor.told(huge, CallError.REQUEST_TOO_LARGE)
        route = status_of(harness.stub.Route, pb2.RouteRequest(query_text="x" * (limit + 1)),
                          metadata=test_frontdoor.AUTH, timeout=5)
        assert route.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert test_frontdoor.told(route, CallError.REQUEST_TOO_LARGE)
        assert len(harness.store.requests) == 1  # only the valid query was recorded
    finally:
        harness.close()


# --- API keys never in logs ------------------------------------------------------------------------


class RecordKeys(FakeStore):
    """The fake records, except API keys: the real `RecordStore` (hashed keys, revocation)."""

    records: RecordStore

    def add_key(self, key, tenant, scopes=None) -> None:  # the harness's fixed keys: unused here
        return None

    def principal_for_key(self, key: str) -> Principal | None:
        return self.records.principal_for_key(key)


def test_api_keys_never_reach_the_logs_or_the_spans(tmp_path, monkeypatch, caplog, capfd):
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    upgrade_database(url)
    records = RecordStore(make_engine(url))
    good, revoked = records.create_api_key("acme"), records.create_api_key("acme")
    assert records.revoke_api_key(records.list_api_keys()[-1].id)  # the second key made
    bad = "arag_bad-" + "k" * 24
    RecordKeys.records = records
    monkeypatch.setattr(test_frontdoor, "FakeStore", RecordKeys)
    stream = io.StringIO()
    caplog.set_level(logging.DEBUG)
    configure_logging("DEBUG", stream=stream)
    harness = Harness(make_settings(key_cache_s=0))
    try:
        with recorded() as spans:
            assert harness.answer("What is 2+2?", metadata=(("authorization", f"Bearer {good}"),))[0].answer
            for key in (revoked, bad):
                error = status_of(harness.answer, "What is 2+2?", metadata=(("authorization", f"Bearer {key}"),))
                assert error.code() is grpc.StatusCode.UNAUTHENTICATED
                assert key not in error.details()
            error = status_of(harness.answer, "What is 2+2?", metadata=(("authorization", f"Token {good}"),))
            assert error.code() is grpc.StatusCode.UNAUTHENTICATED and good not in error.details()
    finally:
        harness.close()
    out, err = capfd.readouterr()
    logs = stream.getvalue()
    events = [json.loads(line)["event"] for line in logs.splitlines() if line.startswith("{")]
    assert events.count("rpc") == 4  # every call was logged, so the check below saw them
    span_text = json.dumps([{"name": s.name, "attributes": dict(s.attributes or {}),
                             "events": [dict(e.attributes or {}) for e in s.events]} for s in spans.all],
                           default=str)
    everything = "\n".join((logs, caplog.text, out, err, span_text))
    for key in (good, revoked, bad):
        for piece in (key, key.split("_", 1)[-1]):
            assert piece not in everything, "an API key reached the logs"


# --- orchestrator probes ---------------------------------------------------------------------------


def test_the_probe_separates_readiness_from_liveness_over_tls(pki):
    from services.frontdoor.probe import check

    harness = Harness(make_settings(tls_cert=pki["server_pem"], tls_key=pki["server_key"]), health_watch_s=0.05)
    try:
        probed = make_settings(tls_cert=pki["server_pem"], tls_key=pki["server_key"],
                               grpc_listen=f"0.0.0.0:{harness.running.port}")
        assert check(probed, ca=pki["ca_pem"]) == "SERVING"
        harness.store.down = ConnectionRefusedError("database away")
        deadline = time.monotonic() + 5
        while check(probed, ca=pki["ca_pem"]) != "NOT_SERVING" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert check(probed, ca=pki["ca_pem"]) == "NOT_SERVING"
        assert check(probed, liveness=True, ca=pki["ca_pem"]) == "SERVING"
    finally:
        harness.close()
    assert check(probed, liveness=True, timeout_s=0.5, ca=pki["ca_pem"]).startswith("UNREACHABLE")
