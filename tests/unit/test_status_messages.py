"""No internal detail reaches a client: every exception the front door maps to a status, raised
with a text that names an address and an exception class (what a driver's error looks like),
ends the call with its status, the stable message of its `CallError` and the request id when the
call has one, through the real gRPC server on loopback. The text itself is in the call's log line."""

from __future__ import annotations

import io
import json

import grpc
import pytest
from test_frontdoor import AUTH, Harness, make_settings, status_of, trailing

from adaptive_rag.contracts import CALL_ERROR_MESSAGES, CallError, ErrorCode
from adaptive_rag.errors import AnswerFailedError, AnswerTimeoutError, OverShareError
from adaptive_rag.logs import configure_logging
from services.frontdoor.server import STATUS_FOR_CODE, STATUS_FOR_ERROR

ADDRESS = "127.0.0.1:6379"
CLASS_NAME = "redis.exceptions.ConnectionError"
INTERNAL_TEXT = f"{CLASS_NAME}: Error 111 connecting to {ADDRESS}. Connection refused."
REQUEST_ID = "feedc0de" * 4


def raised(error_type: type[Exception]) -> Exception:
    """An instance of `error_type` whose text is all internal detail."""
    if error_type is AnswerTimeoutError:
        return AnswerTimeoutError(INTERNAL_TEXT, REQUEST_ID)
    if error_type is OverShareError:
        return OverShareError(INTERNAL_TEXT, retry_after_s=1.0)
    return error_type(INTERNAL_TEXT)


FAILURES = [
    *[(raised(error_type), status) for error_type, status in STATUS_FOR_ERROR],
    (raised(OverShareError), grpc.StatusCode.RESOURCE_EXHAUSTED),
    *[(AnswerFailedError(INTERNAL_TEXT, code), status) for code, status in STATUS_FOR_CODE.items()],
    (KeyError(INTERNAL_TEXT), grpc.StatusCode.INTERNAL),  # a bug: mapped by no row
]


@pytest.fixture(scope="module")
def harness():
    h = Harness(make_settings())
    yield h
    h.close()


@pytest.mark.parametrize(("exc", "status"), FAILURES, ids=lambda value: type(value).__name__)
@pytest.mark.parametrize("with_request_id", [False, True], ids=["no request id", "request id"])
def test_a_mapped_exception_reaches_the_client_as_its_status_and_stable_message_only(
        harness, monkeypatch, exc, status, with_request_id):
    async def failing(command, progress):
        if with_request_id:
            progress.bind(request_id=REQUEST_ID)
        raise exc

    monkeypatch.setattr(harness.running.servicer.service, "answer", failing)
    stream = io.StringIO()
    configure_logging("INFO", stream)
    try:
        error = status_of(harness.answer, "What is 2+2?")
    finally:
        configure_logging("WARNING")
    reason = exc.reason if hasattr(exc, "reason") else CallError.INTERNAL
    metadata = trailing(error.trailing_metadata())
    assert error.code() is status
    expected = CALL_ERROR_MESSAGES[reason] + (f" (request {REQUEST_ID})" if with_request_id else "")
    assert error.details() == expected and metadata["x-error-code"] == reason.value
    seen_by_client = " ".join([error.details(), *metadata.values()])
    for internal in (ADDRESS, "127.0.0.1", "Error 111", CLASS_NAME, "ConnectionError", type(exc).__name__):
        assert internal not in seen_by_client
    assert metadata.get("x-request-id") == (REQUEST_ID if with_request_id else None)
    logged = [json.loads(line) for line in stream.getvalue().splitlines()]
    [rpc] = [line for line in logged if line["event"] == "rpc"]
    assert ADDRESS in rpc["detail"] and CLASS_NAME in rpc["detail"]  # the operator sees it all
    assert rpc["error_code"] == reason.value and rpc["code"] == status.name


def test_every_code_has_a_message_without_internal_detail():
    assert set(CALL_ERROR_MESSAGES) == set(CallError)
    for message in CALL_ERROR_MESSAGES.values():
        assert "127.0.0.1" not in message and "Error" not in message and len(message) < 300


def test_every_worker_error_code_is_mapped():
    assert set(STATUS_FOR_CODE) == set(ErrorCode)


def test_a_revoked_key_is_told_the_same_as_an_unknown_one(harness):
    """Nothing in the reply tells an unknown key from a revoked or malformed one."""
    replies = {status_of(harness.answer, "What is 2+2?", metadata=metadata).details()
               for metadata in [(), (("authorization", "Bearer arag_unknown"),),
                                (("authorization", "Basic x"),)]}
    assert replies == {CALL_ERROR_MESSAGES[CallError.UNAUTHENTICATED]}
    assert harness.answer("What is 2+2?", metadata=AUTH)[0].answer
