"""Typed payloads: how an activity's annotations turn the bytes on the wire into values and back.

The wire stays bytes. A typed payload is JSON and its task carries the header
``content-type: application/json`` (see ``TaskSpec.headers``); a task's result uses the same
encoding as its payload. Dataclasses become JSON objects (field by field, nested ones too),
pydantic models (when pydantic is installed; it is never imported here) use
``model_dump(mode="json")``/``model_validate``, and plain JSON types pass as they are.
``bytes`` stays bytes, untouched, with no content type.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["CONTENT_TYPE", "JSON", "decode", "encode", "hints", "is_raw"]

#: The header naming a payload's encoding, and the one encoding typed payloads use.
CONTENT_TYPE = "content-type"
JSON = "application/json"

_RAW = (bytes, bytearray, memoryview)


def hints(fn: Callable[..., Any]) -> tuple[Any, Any]:
    """The annotations of ``fn``'s first parameter and of its return (``Any`` where missing)."""
    try:
        found = typing.get_type_hints(fn)
        parameters = list(inspect.signature(fn).parameters)
    except Exception:  # unresolvable forward references, builtins: treat as unannotated
        return Any, Any
    first = found.get(parameters[0], Any) if parameters else Any
    return first, found.get("return", Any)


def is_raw(annotation: Any) -> bool:
    """True for a parameter that takes the payload bytes as they are (or says nothing)."""
    return annotation is Any or annotation in _RAW


def encode(value: object) -> tuple[bytes, str | None]:
    """The bytes of ``value`` and their content type (None for bytes, which pass as they are)."""
    if isinstance(value, _RAW):
        return bytes(value), None
    return json.dumps(_plain(value), separators=(",", ":")).encode(), JSON


def decode(data: bytes, annotation: Any) -> Any:
    """``data`` (JSON unless the annotation asks for bytes) as a value of ``annotation``."""
    if is_raw(annotation):
        return bytes(data)
    if annotation is None or annotation is type(None):
        return None
    try:
        raw = json.loads(data) if data else None
    except ValueError as exc:
        raise TypeError(f"payload is not JSON ({exc}); a typed activity takes JSON") from exc
    return _build(raw, annotation)


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _build(raw: Any, annotation: Any) -> Any:
    if annotation is Any or raw is None:
        return raw
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            if option is type(None):
                continue
            try:
                return _build(raw, option)
            except (TypeError, ValueError, KeyError):
                continue
        raise TypeError(f"{raw!r} fits none of {annotation}")
    if origin in (list, tuple, set, frozenset) and isinstance(raw, list):
        item = args[0] if args else Any
        return origin(_build(v, item) for v in raw)
    if origin is dict and isinstance(raw, dict):
        value_type = args[1] if len(args) == 2 else Any
        return {k: _build(v, value_type) for k, v in raw.items()}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if not isinstance(raw, dict):
            raise TypeError(f"{annotation.__name__} needs a JSON object, not {type(raw).__name__}")
        field_types = typing.get_type_hints(annotation)
        known = {f.name for f in dataclasses.fields(annotation) if f.init}
        return annotation(**{k: _build(v, field_types.get(k, Any)) for k, v in raw.items() if k in known})
    validate = getattr(annotation, "model_validate", None)
    if callable(validate):
        return validate(raw)
    return raw
