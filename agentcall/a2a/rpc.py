"""The JSON-RPC binding of A2A v1.0 as the bridge reads and writes it: pure, no I/O.

One request is one JSON-RPC 2.0 object posted to an agent's URL. :func:`parse_request` reads the
envelope (strict JSON through :mod:`agentcall.strictjson`: no duplicate keys, no NaN) and then
the ``params`` of the method named, each into one frozen shape: :class:`SendParams` for
``SendMessage`` and ``SendStreamingMessage``, :class:`TaskIdParams` for ``GetTask`` and
``CancelTask``. Every bad input raises :class:`RpcError` carrying A2A's code for it (the codes
of the protocol's error table, as the ``a2a-sdk`` names them), so the web layer only writes it.

The params are ProtoJSON of the A2A messages (lowerCamelCase members, enums by name). Members
this bridge does not know are refused rather than ignored, so a client learns at once that a
field it relies on has no effect here; the one open object is ``metadata``, of which the bridge
reads ``agentcall.task`` on the message (one of the callee's named tasks, ``--task``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentcall import ids, limits, strictjson

# The methods of A2A v1.0's JSON-RPC binding (its service's method names).
SEND = "SendMessage"
SEND_STREAMING = "SendStreamingMessage"
GET_TASK = "GetTask"
CANCEL_TASK = "CancelTask"
SUPPORTED: Final = (SEND, SEND_STREAMING, GET_TASK, CANCEL_TASK)
# Known to A2A and answered with "not supported" rather than "no such method".
PUSH_METHODS: Final = (
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
)
UNSUPPORTED: Final = ("ListTasks", "SubscribeToTask", "GetExtendedAgentCard")

# The member of a message's metadata that carries AgentCall's own options.
METADATA_KEY: Final = "agentcall"
VERSION_HEADER: Final = "A2A-Version"
PROTOCOL_VERSION: Final = "1.0"
# A request without the header speaks the protocol's previous version (A2A's rule).
VERSION_WITHOUT_HEADER: Final = "0.3"

# A message is at most an AgentCall message; the envelope around it adds little.
MAX_BODY_BYTES: Final = limits.MAX_MESSAGE_BYTES * 2 + 16_384
MAX_ID_CHARS: Final = 200
MAX_PARTS: Final = 64
MAX_LIST_ITEMS: Final = 32
_TEXT_TYPES: Final = ("text/plain", "text/*", "*/*")
# An id a client chose: printable, no spaces (it is echoed in URLs and logs).
_CLIENT_ID_RE: Final = re.compile(r"[\x21-\x7e]{1,200}\Z")


class Code(enum.IntEnum):
    """JSON-RPC error codes: JSON-RPC's own, then A2A's."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    TASK_NOT_FOUND = -32001
    TASK_NOT_CANCELABLE = -32002
    PUSH_NOT_SUPPORTED = -32003
    UNSUPPORTED_OPERATION = -32004
    CONTENT_TYPE_NOT_SUPPORTED = -32005
    VERSION_NOT_SUPPORTED = -32009


# The reason A2A names each code by (google.rpc.ErrorInfo's ``reason``).
REASONS: Final[Mapping[Code, str]] = {
    Code.PARSE_ERROR: "PARSE_ERROR",
    Code.INVALID_REQUEST: "INVALID_REQUEST",
    Code.METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
    Code.INVALID_PARAMS: "INVALID_PARAMS",
    Code.INTERNAL_ERROR: "INTERNAL_ERROR",
    Code.TASK_NOT_FOUND: "TASK_NOT_FOUND",
    Code.TASK_NOT_CANCELABLE: "TASK_NOT_CANCELABLE",
    Code.PUSH_NOT_SUPPORTED: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    Code.UNSUPPORTED_OPERATION: "UNSUPPORTED_OPERATION",
    Code.CONTENT_TYPE_NOT_SUPPORTED: "CONTENT_TYPE_NOT_SUPPORTED",
    Code.VERSION_NOT_SUPPORTED: "VERSION_NOT_SUPPORTED",
}
ERROR_INFO_TYPE: Final = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN: Final = "a2a-protocol.org"

RequestId = str | int | None


class RpcError(Exception):
    """A request refused with a JSON-RPC error; ``request_id`` once the envelope was read."""

    def __init__(self, code: Code, message: str, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def _invalid(message: str) -> RpcError:
    return RpcError(Code.INVALID_PARAMS, message)


@attrs.frozen
class Envelope:
    """A JSON-RPC request as read: its id, method and still unread params."""

    request_id: RequestId
    method: str
    params: Mapping[str, Any]


@attrs.frozen
class SendParams:
    """``SendMessage`` / ``SendStreamingMessage``: the user's text and where it belongs."""

    text: str
    message_id: str
    context_id: str | None
    task_id: str | None
    return_immediately: bool
    history_length: int | None
    task: str | None = None  # one of the callee's named tasks (``metadata.agentcall.task``)


@attrs.frozen
class TaskIdParams:
    """``GetTask`` / ``CancelTask``: the task, and how much history to show (GetTask)."""

    task_id: str
    history_length: int | None = None


@attrs.frozen
class Request:
    """A request ready to act on."""

    request_id: RequestId
    method: str
    params: SendParams | TaskIdParams


# --- the envelope ----------------------------------------------------------------------------


def read_envelope(body: bytes) -> Envelope:
    """The JSON-RPC envelope of ``body``; :class:`RpcError` (parse or invalid request) else."""
    if len(body) > MAX_BODY_BYTES:
        raise RpcError(Code.INVALID_REQUEST, f"the request is larger than {MAX_BODY_BYTES} bytes")
    try:
        raw = strictjson.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RpcError(Code.PARSE_ERROR, f"the body is not valid JSON ({exc})") from None
    if isinstance(raw, list):
        raise RpcError(Code.INVALID_REQUEST, "batch requests are not supported")
    if not isinstance(raw, dict):
        raise RpcError(Code.INVALID_REQUEST, "a JSON-RPC request is a JSON object")
    request_id = raw.get("id")
    if type(request_id) is str:
        if len(request_id) > MAX_ID_CHARS:
            raise RpcError(Code.INVALID_REQUEST, f"the id is longer than {MAX_ID_CHARS}")
    elif type(request_id) is not int and request_id is not None:
        raise RpcError(Code.INVALID_REQUEST, "the id must be a string, an integer or null")
    extra = set(raw) - {"jsonrpc", "id", "method", "params"}
    if extra:
        raise RpcError(
            Code.INVALID_REQUEST, f"unknown members: {', '.join(sorted(extra))}", request_id
        )
    if raw.get("jsonrpc") != "2.0":
        raise RpcError(Code.INVALID_REQUEST, "'jsonrpc' must be exactly \"2.0\"", request_id)
    if "id" not in raw:
        # A notification gets no answer, and every A2A method has one to give.
        raise RpcError(Code.INVALID_REQUEST, "a request needs an id", request_id)
    method = raw.get("method")
    if type(method) is not str or not method:
        raise RpcError(Code.INVALID_REQUEST, "'method' must be a non-empty string", request_id)
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(Code.INVALID_PARAMS, "'params' must be an object", request_id)
    return Envelope(request_id, method, params)


def check_version(header: str | None) -> None:
    """Refuse a request whose ``A2A-Version`` is not 1.0 (a patch level is ignored)."""
    version = (header or "").strip() or VERSION_WITHOUT_HEADER
    major_minor = version.split(".")[:2]
    if major_minor != PROTOCOL_VERSION.split("."):
        raise RpcError(
            Code.VERSION_NOT_SUPPORTED,
            f"A2A version {version!r} is not supported here; this bridge speaks "
            f"{PROTOCOL_VERSION} (send the header {VERSION_HEADER}: {PROTOCOL_VERSION})",
        )


def parse_request(body: bytes, version_header: str | None) -> Request:
    """The request in ``body``, its params read into their shape; :class:`RpcError` else
    (with the request's id once it is known)."""
    envelope = read_envelope(body)
    try:
        return Request(envelope.request_id, envelope.method, _params(envelope, version_header))
    except RpcError as exc:
        exc.request_id = envelope.request_id
        raise


def _params(envelope: Envelope, version_header: str | None) -> SendParams | TaskIdParams:
    method = envelope.method
    if method not in SUPPORTED and method not in PUSH_METHODS and method not in UNSUPPORTED:
        raise RpcError(Code.METHOD_NOT_FOUND, f"no method {method[:80]!r}")
    check_version(version_header)
    if method in PUSH_METHODS:
        raise RpcError(Code.PUSH_NOT_SUPPORTED, "push notifications are not supported")
    if method in UNSUPPORTED:
        raise RpcError(Code.UNSUPPORTED_OPERATION, f"{method} is not supported by this bridge")
    if method in (SEND, SEND_STREAMING):
        return send_params(envelope.params)
    return task_id_params(envelope.params, history=method == GET_TASK)


# --- the shapes ------------------------------------------------------------------------------


def _only(raw: Mapping[str, Any], what: str, allowed: set[str]) -> None:
    extra = set(raw) - allowed
    if extra:
        raise _invalid(f"{what}: unknown members {', '.join(sorted(extra))}")


def _object(raw: object, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise _invalid(f"{what} must be an object")
    return raw


def _string(raw: Mapping[str, Any], key: str, what: str, *, required: bool = False) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise _invalid(f"{what}.{key} is required")
        return None
    if type(value) is not str:
        raise _invalid(f"{what}.{key} must be a string")
    return value


def _required(value: str | None) -> str:
    """``value`` of a member read with ``required=True`` (which raised if it was missing)."""
    if value is None:
        raise _invalid("a required member is missing")
    return value


def _client_id(
    raw: Mapping[str, Any], key: str, what: str, *, required: bool = False
) -> str | None:
    value = _string(raw, key, what, required=required)
    if value is None or (value == "" and not required):
        return None
    if _CLIENT_ID_RE.match(value) is None:
        raise _invalid(f"{what}.{key} must be 1 to {MAX_ID_CHARS} printable characters, no spaces")
    return value


def _strings(raw: Mapping[str, Any], key: str, what: str) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_LIST_ITEMS:
        raise _invalid(f"{what}.{key} must be a list of at most {MAX_LIST_ITEMS} strings")
    if any(type(item) is not str for item in value):
        raise _invalid(f"{what}.{key} must hold strings only")
    return value


def _history_length(raw: Mapping[str, Any], what: str) -> int | None:
    value = raw.get("historyLength")
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise _invalid(f"{what}.historyLength must be a whole number, 0 or more")
    return value


def _tenant(raw: Mapping[str, Any], what: str) -> None:
    if _string(raw, "tenant", what):
        raise _invalid(f"{what}.tenant: this bridge has no tenants")


def _metadata(raw: Mapping[str, Any], what: str) -> None:
    if "metadata" in raw and raw["metadata"] is not None:
        _object(raw["metadata"], f"{what}.metadata")


def _agentcall_task(message: Mapping[str, Any]) -> str | None:
    """The AgentCall task a message names in ``metadata.agentcall.task``, if any."""
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get(METADATA_KEY) is None:
        return None
    what = f"message.metadata.{METADATA_KEY}"
    ours = _object(metadata[METADATA_KEY], what)
    _only(ours, what, {"task"})
    task = _string(ours, "task", what)
    if task is not None and not ids.is_task_id(task):
        raise _invalid(f"{what}.task {task[:80]!r} is not a task id (lowercase, digits, '-')")
    return task


def _text_part(raw: object, index: int) -> str:
    what = f"message.parts[{index}]"
    part = _object(raw, what)
    _only(part, what, {"text", "raw", "url", "data", "metadata", "filename", "mediaType"})
    _metadata(part, what)
    kinds = [key for key in ("text", "raw", "url", "data") if key in part]
    if len(kinds) != 1:
        raise _invalid(f"{what} must hold exactly one of text, raw, url or data")
    if kinds[0] != "text":
        raise RpcError(
            Code.CONTENT_TYPE_NOT_SUPPORTED,
            f"{what} is {kinds[0]}: an AgentCall call carries text parts only",
        )
    media_type = _string(part, "mediaType", what)
    if media_type and not media_type.lower().startswith("text/"):
        raise RpcError(
            Code.CONTENT_TYPE_NOT_SUPPORTED, f"{what} is {media_type[:80]}: text parts only"
        )
    _string(part, "filename", what)
    return _required(_string(part, "text", what, required=True))


def send_params(raw: Mapping[str, Any]) -> SendParams:
    """The shape of a ``SendMessageRequest``; :class:`RpcError` for anything else."""
    _only(raw, "params", {"tenant", "message", "configuration", "metadata"})
    _tenant(raw, "params")
    _metadata(raw, "params")
    if "message" not in raw:
        raise _invalid("params.message is required")
    message = _object(raw["message"], "params.message")
    what = "message"
    _only(
        message,
        what,
        {
            "messageId",
            "contextId",
            "taskId",
            "role",
            "parts",
            "metadata",
            "extensions",
            "referenceTaskIds",
        },
    )
    _metadata(message, what)
    _strings(message, "extensions", what)
    _strings(message, "referenceTaskIds", what)
    message_id = _required(_client_id(message, "messageId", what, required=True))
    role = message.get("role")
    if role not in ("ROLE_USER", 1):
        raise _invalid("message.role must be ROLE_USER")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts or len(parts) > MAX_PARTS:
        raise _invalid(f"message.parts must be a list of 1 to {MAX_PARTS} parts")
    text = "\n".join(_text_part(part, index) for index, part in enumerate(parts))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.MAX_MESSAGE_BYTES:
        raise _invalid(f"the message is {size} bytes; the limit is {limits.MAX_MESSAGE_BYTES}")
    if not text.strip():
        raise _invalid("the message has no text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid("the message is not valid UTF-8 text") from None
    return_immediately = False
    history_length = None
    if raw.get("configuration") is not None:
        config = _object(raw["configuration"], "params.configuration")
        what = "configuration"
        _only(
            config,
            what,
            {
                "acceptedOutputModes",
                "taskPushNotificationConfig",
                "historyLength",
                "returnImmediately",
            },
        )
        if config.get("taskPushNotificationConfig") is not None:
            raise RpcError(Code.PUSH_NOT_SUPPORTED, "push notifications are not supported")
        modes = _strings(config, "acceptedOutputModes", what)
        if modes and not any(mode.lower() in _TEXT_TYPES for mode in modes):
            raise RpcError(
                Code.CONTENT_TYPE_NOT_SUPPORTED,
                "the answer is text/plain, which acceptedOutputModes does not include",
            )
        history_length = _history_length(config, what)
        flag = config.get("returnImmediately", False)
        if type(flag) is not bool:
            raise _invalid("configuration.returnImmediately must be true or false")
        return_immediately = flag
    return SendParams(
        text=text,
        message_id=message_id,
        context_id=_client_id(message, "contextId", what="message"),
        task_id=_client_id(message, "taskId", what="message"),
        return_immediately=return_immediately,
        history_length=history_length,
        task=_agentcall_task(message),
    )


def task_id_params(raw: Mapping[str, Any], *, history: bool) -> TaskIdParams:
    """The shape of a ``GetTaskRequest`` (``history``) or a ``CancelTaskRequest``."""
    allowed = {"tenant", "id", "historyLength"} if history else {"tenant", "id", "metadata"}
    _only(raw, "params", allowed)
    _tenant(raw, "params")
    _metadata(raw, "params")
    task_id = _required(_client_id(raw, "id", "params", required=True))
    return TaskIdParams(task_id, _history_length(raw, "params") if history else None)


# --- responses -------------------------------------------------------------------------------


def result(request_id: RequestId, value: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": dict(value)}


def error(
    request_id: RequestId,
    code: Code,
    message: str,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A JSON-RPC error with A2A's ErrorInfo detail (its reason, and ``metadata`` if any)."""
    info: dict[str, Any] = {
        "@type": ERROR_INFO_TYPE,
        "reason": REASONS[code],
        "domain": ERROR_DOMAIN,
    }
    if metadata:
        info["metadata"] = dict(metadata)
    body = {"code": int(code), "message": message, "data": [info]}
    return {"jsonrpc": "2.0", "id": request_id, "error": body}
