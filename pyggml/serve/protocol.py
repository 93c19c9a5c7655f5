"""OpenAI's request checking and error shape: every field is read through `Fields`, so a wrong type or an
out-of-range value becomes a 400 `{"error": {"message", "type", "param", "code"}}` that names the field (its
path inside the body, such as `messages[0].content`). As OpenAI, `code` is a string (`model_not_found`) or null,
never the HTTP status; an explicit null is the same as a field left out."""

from __future__ import annotations

import math

from pyggml.errors import ParameterError


class APIError(ParameterError):
    """An HTTP error in OpenAI's shape (`param` names the request field at fault)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None, code: str | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.kind, self.code = message, status, param, kind, code
        self.headers, self.extra = headers or {}, extra or {}   # extra: llama-server's fields (n_ctx, ...)

    def body(self) -> dict:
        body = error_body(self.message, self.kind, self.param, self.code)
        body["error"].update(self.extra)
        return body


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


_KINDS = {int: "an integer", float: "a number", bool: "a boolean", str: "a string", list: "an array",
          dict: "an object"}


class Fields:
    """Typed reads of one JSON body; a missing field gives the default, a wrong one an APIError naming it."""

    def __init__(self, body, where: str = ""):
        if not isinstance(body, dict):
            raise APIError(f"'{where}' must be an object, got {_json_type(body)}" if where else
                           f"the request body must be a JSON object, got {_json_type(body)}", param=where or None)
        self.body, self.where = body, where

    def _name(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def get(self, name: str, kind, default=None, low=None, high=None, choices=None, required: bool = False):
        """The field as `kind` (int, float, bool, str, list, dict or a tuple of them); null counts as missing."""
        value = self.body.get(name)
        if value is None:
            if required:
                raise APIError(f"'{self._name(name)}' is required", param=self._name(name))
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not any(_is(value, k) for k in kinds):
            raise APIError(f"'{self._name(name)}' must be {' or '.join(_KINDS[k] for k in kinds)}, "
                           f"got {_json_type(value)}", param=self._name(name))
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if choices is not None and value not in choices:
            raise APIError(f"'{self._name(name)}' must be one of {', '.join(map(repr, choices))}, got {value!r}",
                           param=self._name(name))
        if (low is not None and value < low) or (high is not None and value > high):
            raise APIError(f"'{self._name(name)}' must be in [{low if low is not None else '-inf'}, "
                           f"{high if high is not None else 'inf'}], got {value!r}", param=self._name(name))
        return value

    def obj(self, name: str, required: bool = False) -> "Fields | None":
        value = self.get(name, dict, required=required)
        return None if value is None else Fields(value, self._name(name))


def _is(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _json_type(value) -> str:
    for kind, word in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return word
    return type(value).__name__
