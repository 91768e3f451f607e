"""The error a front end answers to the client: an HTTP status with the
OpenAI or Anthropic error shape, and the text it echoes made safe to encode.

Standard library only.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["ApiError", "bad", "safe_text"]


class ApiError(Exception):
    """An error answered to the client.  `kind` is the OpenAI/Anthropic error
    type name; `param` names the offending field (OpenAI shape only)."""

    def __init__(self, status: int, message: str, kind: str | None = None, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        message = safe_text(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or _DEFAULT_KIND.get(status, "api_error")
        self.param = safe_text(param) if param is not None else None
        self.code = code
        self.headers = dict(headers or {})

    def openai(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def anthropic(self) -> dict:
        return {"type": "error", "error": {"type": _ANTHROPIC_KIND.get(self.status, self.kind),
                                            "message": self.message}}


_DEFAULT_KIND = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    411: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
    431: "invalid_request_error", 500: "server_error", 501: "invalid_request_error",
    503: "service_unavailable", 505: "invalid_request_error",
}
_ANTHROPIC_KIND = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    411: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
    431: "invalid_request_error", 500: "api_error", 501: "invalid_request_error",
    503: "overloaded_error", 505: "invalid_request_error",
}


def safe_text(s: str) -> str:
    """`s` with lone surrogates escaped (\\udXXX), so it always encodes as UTF-8:
    error messages echo what the client sent."""
    s = str(s)
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)
