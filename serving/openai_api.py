"""The OpenAI side of the gateway: request body checks and errors in the OpenAI shape.

Errors always have the shape `{"error": {"message", "type", "param", "code"}}`: raise `ApiError`
(or `bad_request(...)`, a 400) and the gateway answers `ApiError.response()`. `parse_body` checks a
completions / chat completions body (JSON object, field types) without Pydantic;
`prompt_token_bound` bounds its prompt tokens for admission without tokenizing; `upstream_error`
passes vLLM's own errors through in that shape.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

# --- errors -----------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def response(self) -> Response:
        return error_response(self.status, self.message, self.type, self.code, self.param, self.headers)


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_request", param=param)


def upstream_error(status: int, data: bytes) -> Response:
    """vLLM's error passed through; rewrapped in the OpenAI shape if it is not already."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error = parsed["error"]
        return error_response(
            status,
            str(error.get("message", "")),
            "invalid_request_error" if 400 <= status < 500 else "api_error",
            None if error.get("code") is None else str(error.get("code")),
            error.get("param"),
        )
    message = data.decode(errors="replace")[:500] or f"upstream answered {status}"
    return error_response(status if status >= 400 else 502, message, "api_error", "upstream_error")


# --- request body checks ---------------------------------------------------------------------

_INT = "integer"
_NUM = "number"
_BOOL = "boolean"
_STR = "string"
_OBJ = "object"
_COMMON_FIELDS = {
    "max_tokens": _INT,
    "max_completion_tokens": _INT,
    "n": _INT,
    "seed": _INT,
    "temperature": _NUM,
    "top_p": _NUM,
    "presence_penalty": _NUM,
    "frequency_penalty": _NUM,
    "stream": _BOOL,
    "stream_options": _OBJ,
    "user": _STR,
}
_CHAT_ROLES = {"system", "user", "assistant", "tool", "developer", "function"}


def _type_ok(value: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _STR:
        return isinstance(value, str)
    return isinstance(value, dict)


def parse_body(raw: bytes, kind: str) -> dict:
    """The request body as a dict, or ApiError(400) naming the first problem."""
    if not raw:
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    for name, expected in _COMMON_FIELDS.items():
        value = body.get(name)
        if value is not None and not _type_ok(value, expected):
            raise bad_request(f"'{name}' must be a {expected}", name)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and value < 1:
            raise bad_request(f"'{name}' must be at least 1", name)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty list", "messages")
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise bad_request(f"messages[{index}] must be an object", f"messages[{index}]")
            if message.get("role") not in _CHAT_ROLES:
                raise bad_request(
                    f"messages[{index}].role must be one of {sorted(_CHAT_ROLES)}", f"messages[{index}].role"
                )
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                raise bad_request(
                    f"messages[{index}].content must be a string or a list of parts",
                    f"messages[{index}].content",
                )
    else:
        prompt = body.get("prompt")
        if not _prompt_ok(prompt):
            raise bad_request("'prompt' is required: a string, a list of strings, or token ids", "prompt")
    return body


def _prompt_ok(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    if all(isinstance(p, str) for p in prompt):
        return True
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return True
    return all(
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        for p in prompt
    )


def prompt_token_bound(body: dict) -> int:
    """An upper bound of the prompt's tokens without tokenizing: one per UTF-8 byte (byte-level
    BPE never needs more), plus a few per chat message for the template. Used for reservations;
    settlement corrects to the real count."""
    prompt = body.get("prompt")
    if prompt is not None:
        if isinstance(prompt, str):
            return len(prompt.encode())
        total = 0
        for item in prompt:
            total += (
                len(item.encode()) if isinstance(item, str) else (len(item) if isinstance(item, list) else 1)
            )
        return total
    total = 0
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.encode())
        elif isinstance(content, list):
            total += len(orjson.dumps(content))
        total += 8
    return total + 8


async def read_json_object(request: Request) -> dict:
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body
