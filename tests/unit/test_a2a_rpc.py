"""The bridge's reading of A2A JSON-RPC requests: every bad input is one A2A error code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentcall import limits
from agentcall.a2a import rpc
from agentcall.a2a.rpc import Code

V1 = "1.0"


def _body(method: str = "SendMessage", params: Any = None, **envelope: Any) -> bytes:
    raw: dict[str, Any] = {"jsonrpc": "2.0", "id": "r1", "method": method}
    if params is not None:
        raw["params"] = params
    raw.update(envelope)
    return json.dumps(raw).encode()


def _message(**changes: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": "m1",
        "role": "ROLE_USER",
        "parts": [{"text": "why did CI fail?"}],
    }
    message.update(changes)
    return message


def _refused(body: bytes, version: str | None = V1) -> rpc.RpcError:
    with pytest.raises(rpc.RpcError) as caught:
        rpc.parse_request(body, version)
    return caught.value


def test_a_send_message_is_read_into_its_shape() -> None:
    request = rpc.parse_request(_body(params={"message": _message(contextId="c-1")}), V1)
    assert request.request_id == "r1"
    assert request.method == rpc.SEND
    assert request.params == rpc.SendParams(
        text="why did CI fail?",
        message_id="m1",
        context_id="c-1",
        task_id=None,
        return_immediately=False,
        history_length=None,
    )


def test_text_parts_are_joined_and_configuration_is_read() -> None:
    params = {
        "message": _message(parts=[{"text": "one"}, {"text": "two", "mediaType": "text/plain"}]),
        "configuration": {
            "acceptedOutputModes": ["text/plain"],
            "historyLength": 0,
            "returnImmediately": True,
        },
        "metadata": {"anything": [1, 2]},
    }
    request = rpc.parse_request(_body("SendStreamingMessage", params), "1.0.3")
    assert isinstance(request.params, rpc.SendParams)
    assert request.params.text == "one\ntwo"
    assert request.params.return_immediately is True
    assert request.params.history_length == 0


def test_a_message_may_name_an_agentcall_task() -> None:
    message = _message(metadata={"agentcall": {"task": "review"}, "other": 1})
    request = rpc.parse_request(_body(params={"message": message}), V1)
    assert isinstance(request.params, rpc.SendParams)
    assert request.params.task == "review"
    plain = rpc.parse_request(_body(params={"message": _message(metadata={"x": 1})}), V1)
    assert isinstance(plain.params, rpc.SendParams) and plain.params.task is None


@pytest.mark.parametrize(
    "ours", ["review", {"task": "Review!"}, {"task": 5}, {"task": "ok", "model": "x"}]
)
def test_a_bad_agentcall_task_is_invalid(ours: Any) -> None:
    message = _message(metadata={"agentcall": ours})
    assert _refused(_body(params={"message": message})).code is Code.INVALID_PARAMS


def test_get_and_cancel_read_the_task_id() -> None:
    got = rpc.parse_request(_body("GetTask", {"id": "t1", "historyLength": 2}), V1)
    assert got.params == rpc.TaskIdParams("t1", 2)
    cancel = rpc.parse_request(_body("CancelTask", {"id": "t1", "metadata": {}}), V1)
    assert cancel.params == rpc.TaskIdParams("t1")
    assert _refused(_body("CancelTask", {"id": "t1", "historyLength": 2})).code is (
        Code.INVALID_PARAMS
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", Code.PARSE_ERROR),
        (b'{"a": 1, "a": 2}', Code.PARSE_ERROR),
        (b'{"x": NaN}', Code.PARSE_ERROR),
        (b"\xff\xfe", Code.PARSE_ERROR),
        (b"[]", Code.INVALID_REQUEST),
        (b'"text"', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "GetTask"}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "method": "GetTask"}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": true, "method": "GetTask"}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "GetTask"}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": ""}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "x": 1}', Code.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": []}', Code.INVALID_PARAMS),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get"}', Code.METHOD_NOT_FOUND),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}', Code.UNSUPPORTED_OPERATION),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask"}', Code.UNSUPPORTED_OPERATION),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTaskPushNotificationConfig"}',
            Code.PUSH_NOT_SUPPORTED,
        ),
    ],
)
def test_bad_envelopes_get_their_code(body: bytes, code: Code) -> None:
    assert _refused(body).code is code


def test_an_oversize_body_or_id_is_refused() -> None:
    assert _refused(b" " * (rpc.MAX_BODY_BYTES + 1)).code is Code.INVALID_REQUEST
    long_id = json.dumps({"jsonrpc": "2.0", "id": "x" * 201, "method": "GetTask"}).encode()
    assert _refused(long_id).code is Code.INVALID_REQUEST


def test_the_request_id_comes_back_with_a_later_error() -> None:
    error = _refused(_body("GetTask", {}, id=42))
    assert error.code is Code.INVALID_PARAMS
    assert error.request_id == 42


@pytest.mark.parametrize("version", [None, "", "0.3", "2.0", "1", "banana"])
def test_only_version_1_0_is_spoken(version: str | None) -> None:
    error = _refused(_body("GetTask", {"id": "t"}), version)
    assert error.code is Code.VERSION_NOT_SUPPORTED
    assert "A2A-Version: 1.0" in error.message


def test_an_unknown_method_is_not_found_whatever_the_version() -> None:
    assert _refused(_body("Nope", {}), None).code is Code.METHOD_NOT_FOUND


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, Code.INVALID_PARAMS),
        ({"message": "hi"}, Code.INVALID_PARAMS),
        ({"message": _message(), "extra": 1}, Code.INVALID_PARAMS),
        ({"message": _message(), "tenant": "t1"}, Code.INVALID_PARAMS),
        ({"message": _message(), "metadata": []}, Code.INVALID_PARAMS),
        ({"message": _message(kind="message")}, Code.INVALID_PARAMS),
        ({"message": _message(role="ROLE_AGENT")}, Code.INVALID_PARAMS),
        ({"message": _message(role=None)}, Code.INVALID_PARAMS),
        ({"message": _message(messageId=None)}, Code.INVALID_PARAMS),
        ({"message": _message(messageId="has space")}, Code.INVALID_PARAMS),
        ({"message": _message(messageId=5)}, Code.INVALID_PARAMS),
        ({"message": _message(contextId="x" * 201)}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[])}, Code.INVALID_PARAMS),
        ({"message": _message(parts="hi")}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"text": "a"}] * 65)}, Code.INVALID_PARAMS),
        ({"message": _message(parts=["hi"])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{}])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"text": "a", "url": "u"}])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"text": 5}])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"text": "a", "x": 1}])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"text": "   "}])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"text": "\udcff"}])}, Code.INVALID_PARAMS),
        ({"message": _message(extensions="e")}, Code.INVALID_PARAMS),
        ({"message": _message(extensions=[1])}, Code.INVALID_PARAMS),
        ({"message": _message(parts=[{"url": "https://x"}])}, Code.CONTENT_TYPE_NOT_SUPPORTED),
        ({"message": _message(parts=[{"raw": "AAAA"}])}, Code.CONTENT_TYPE_NOT_SUPPORTED),
        ({"message": _message(parts=[{"data": {}}])}, Code.CONTENT_TYPE_NOT_SUPPORTED),
        (
            {"message": _message(parts=[{"text": "a", "mediaType": "image/png"}])},
            Code.CONTENT_TYPE_NOT_SUPPORTED,
        ),
        (
            {"message": _message(), "configuration": {"acceptedOutputModes": ["image/png"]}},
            Code.CONTENT_TYPE_NOT_SUPPORTED,
        ),
        (
            {"message": _message(), "configuration": {"taskPushNotificationConfig": {}}},
            Code.PUSH_NOT_SUPPORTED,
        ),
        ({"message": _message(), "configuration": {"historyLength": -1}}, Code.INVALID_PARAMS),
        ({"message": _message(), "configuration": {"historyLength": "2"}}, Code.INVALID_PARAMS),
        (
            {"message": _message(), "configuration": {"returnImmediately": "yes"}},
            Code.INVALID_PARAMS,
        ),
        ({"message": _message(), "configuration": {"blocking": True}}, Code.INVALID_PARAMS),
        ({"message": _message(), "configuration": 5}, Code.INVALID_PARAMS),
    ],
)
def test_bad_messages_get_their_code(params: dict[str, Any], code: Code) -> None:
    assert _refused(_body(params=params)).code is code


def test_a_message_may_hold_exactly_the_limit() -> None:
    fits = _message(parts=[{"text": "a" * limits.MAX_MESSAGE_BYTES}])
    assert rpc.parse_request(_body(params={"message": fits}), V1).params
    over = _message(parts=[{"text": "a" * limits.MAX_MESSAGE_BYTES}, {"text": ""}])
    error = _refused(_body(params={"message": over}))
    assert error.code is Code.INVALID_PARAMS
    assert "limit" in error.message


def test_empty_optional_ids_mean_none() -> None:
    request = rpc.parse_request(_body(params={"message": _message(contextId="", taskId="")}), V1)
    assert isinstance(request.params, rpc.SendParams)
    assert request.params.context_id is None and request.params.task_id is None


@pytest.mark.parametrize(
    "params",
    [{}, {"id": ""}, {"id": 5}, {"id": "t", "tenant": "x"}, {"id": "t", "historyLength": -2}],
)
def test_bad_task_ids_are_invalid_params(params: dict[str, Any]) -> None:
    assert _refused(_body("GetTask", params)).code is Code.INVALID_PARAMS


def test_responses_are_json_rpc_with_error_info() -> None:
    assert rpc.result(7, {"task": {}}) == {"jsonrpc": "2.0", "id": 7, "result": {"task": {}}}
    body = rpc.error("r", Code.TASK_NOT_FOUND, "no task t", {"taskId": "t"})
    assert body["id"] == "r"
    assert body["error"]["code"] == -32001
    (info,) = body["error"]["data"]
    assert info["@type"] == rpc.ERROR_INFO_TYPE
    assert info["reason"] == "TASK_NOT_FOUND"
    assert info["metadata"] == {"taskId": "t"}
    assert "metadata" not in rpc.error(None, Code.PARSE_ERROR, "x")["error"]["data"][0]


def test_every_code_has_a_reason() -> None:
    assert set(rpc.REASONS) == set(Code)


def test_the_codes_are_the_sdks() -> None:
    """Our codes are the ones the a2a-sdk client maps back to its errors."""
    errors = pytest.importorskip("a2a.utils.errors")
    sdk = {cls.__name__: code for cls, code in errors.JSON_RPC_ERROR_CODE_MAP.items()}
    assert sdk["TaskNotFoundError"] == Code.TASK_NOT_FOUND
    assert sdk["TaskNotCancelableError"] == Code.TASK_NOT_CANCELABLE
    assert sdk["PushNotificationNotSupportedError"] == Code.PUSH_NOT_SUPPORTED
    assert sdk["UnsupportedOperationError"] == Code.UNSUPPORTED_OPERATION
    assert sdk["ContentTypeNotSupportedError"] == Code.CONTENT_TYPE_NOT_SUPPORTED
    assert sdk["VersionNotSupportedError"] == Code.VERSION_NOT_SUPPORTED
    assert sdk["InvalidParamsError"] == Code.INVALID_PARAMS
    assert sdk["JSONParseError"] == Code.PARSE_ERROR
