"""The wire rules every internal message keeps: a JSON object with ``"v"``, typed fields.

Decoding is strict about types and about the major version, lenient about unknown fields; a
failure raises :class:`~jetcrawl.contract.errors.MessageError` with a short ``reason``.
"""

from __future__ import annotations

from typing import Any

import orjson

from jetcrawl.contract.errors import MessageError

__all__ = ["WIRE_VERSION", "check_version", "json_object", "loads", "sequences", "typed"]

WIRE_VERSION = 1


def loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise MessageError("invalid_json", str(e)) from None


def json_object(data: bytes) -> dict[str, Any]:
    obj = loads(data)
    if not isinstance(obj, dict):
        raise MessageError("wrong_type", f"expected a JSON object, got {type(obj).__name__}")
    check_version(obj)
    return obj


def check_version(obj: dict[str, Any], required: bool = True) -> None:
    v = obj.get("v")
    if v is None and not required:
        return
    if type(v) is not int:
        raise MessageError("missing_version" if v is None else "wrong_type", f"v={v!r}")
    if v != WIRE_VERSION:
        raise MessageError(
            "unknown_version", f"major version {v} (this build speaks {WIRE_VERSION})"
        )


def typed(
    obj: dict[str, Any], name: str, kind: type | tuple[type, ...], optional: bool = False
) -> Any:
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise MessageError("missing_field", name)
    value = obj[name]
    # bool is an int subclass; a depth of `true` is a wrong type.
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise MessageError("wrong_type", f"{name}={value!r}")
    return value


def sequences(obj: dict[str, Any], name: str) -> tuple[int, ...]:
    """An optional list of stream sequences (positive ints)."""
    values = typed(obj, name, list, optional=True) or []
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise MessageError("wrong_type", f"{name} must be stream sequences, got {values!r}")
    return tuple(values)
