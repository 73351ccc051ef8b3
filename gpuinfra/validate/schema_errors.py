"""Map Pydantic's errors onto the user's file: a readable path, a position, and a message that says what to do.

Paths name mapping items by their key (`node_groups[gpu-a100].gpu.model`) and list items by index. Union member
tags that Pydantic puts into error locations are dropped, and the errors of one field's union members merge into
one message.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..errors import Diagnostic
from .diagnostics import key_text
from .source import YamlSource

Loc = tuple[str | int, ...]

YAML11_BOOLEANS = {"yes", "no", "on", "off", "y", "n"}


def _unwrap(annotation: Any, data: Any) -> Any:
    """Strip Annotated/Optional; of a union of models pick the member the data's `type` names."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [_unwrap(arg, data) for arg in typing.get_args(annotation) if arg is not type(None)]
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if models:
            wanted = data.get("type") if isinstance(data, dict) else None
            for model in models:
                field = model.model_fields.get("type")
                if field is not None and wanted in typing.get_args(field.annotation):
                    return model
            return models[0]
        return members[0] if len(members) == 1 else annotation
    return annotation


def walk(model: type[BaseModel], data: Any, loc: Sequence[str | int]) -> tuple[Loc, str, Any]:
    """Follow a Pydantic error location through the model and the data.

    Returns the location in the data (union tags removed), its display path, and the type found there.
    """
    annotation: Any = model
    node = data
    kept: list[str | int] = []
    path = ""
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        annotation = _unwrap(annotation, node)
        origin = typing.get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if not isinstance(part, str) or part not in annotation.model_fields:
                if isinstance(node, dict) and part in node:  # an unknown key
                    kept.append(part)
                    path += f".{key_text(part)}" if path else key_text(part)
                    annotation = None
                continue  # otherwise a union tag
            kept.append(part)
            path += f".{part}" if path else part
            annotation = annotation.model_fields[part].annotation
            node = node.get(part) if isinstance(node, dict) else None
        elif origin is dict and isinstance(node, dict) and part in node:
            kept.append(part)
            path += f"[{key_text(part)}]"
            annotation = typing.get_args(annotation)[1]
            node = node[part]
        elif origin is list and isinstance(part, int) and isinstance(node, list):
            kept.append(part)
            path += f"[{part}]"
            annotation = typing.get_args(annotation)[0]
            node = node[part] if part < len(node) else None
        elif origin is dict and isinstance(node, dict) and part == "[key]":
            continue  # the key itself is invalid; the location stays on the key
        # Anything else is a union member tag ('int', 'str', 'list[str]', ...).
    return tuple(kept), path, _unwrap(annotation, node)


def _message(error: ErrorDetails, expected: Any) -> str:
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required, but missing"
    if kind in ("bool_type", "bool_parsing") and isinstance(value, str) and value.lower() in YAML11_BOOLEANS:
        return f"{value!r} is not a boolean in YAML 1.2: write true or false"
    if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"expected a string, got the number {value}: quote it ('{value}')"
    if kind == "string_type" and value is not None and not isinstance(value, (dict, list)):
        return f"expected a string, got {value!r}: quote it"
    if kind == "literal_error":
        return f"{value!r} is not allowed; {error['msg'][len('Input should be ') :]}"
    if kind == "int_type":
        return f"expected a whole number, got {value!r}"
    if kind == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    msg = error["msg"]
    return msg[0].lower() + msg[1:] if msg else kind


def _did_you_mean(model_type: Any, key: str) -> str:
    if isinstance(model_type, type) and issubclass(model_type, BaseModel):
        close = difflib.get_close_matches(key, list(model_type.model_fields), n=1, cutoff=0.6)
        if close:
            return f"; did you mean {close[0]!r}?"
        return f"; valid keys: {', '.join(model_type.model_fields)}"
    return ""


def diagnostics(model: type[BaseModel], source: YamlSource, data: Any, exc: ValidationError) -> list[Diagnostic]:
    """Every validation error as a positioned diagnostic.

    A union reports one error per member; a member whose type does not even match the value says nothing
    useful when another member got further, so those are dropped and the rest merge into one message.
    """
    merged: dict[Loc, tuple[str, list[tuple[bool, str]]]] = {}
    for error in exc.errors(include_url=False):
        loc, path, found = walk(model, data, error["loc"])
        message = _message(error, found)
        if error["type"] == "extra_forbidden" and loc:
            _, _, parent = walk(model, data, loc[:-1])
            message += _did_you_mean(parent, str(loc[-1]))
        entry = merged.setdefault(loc, (path, []))
        mismatch = error["type"].endswith("_type") or error["type"] == "model_attributes_type"
        if (mismatch, message) not in entry[1]:
            entry[1].append((mismatch, message))
    out = []
    for loc, (path, found_messages) in merged.items():
        useful = [m for mismatch, m in found_messages if not mismatch] or [m for _, m in found_messages]
        out.append(source.diagnostic(loc, path or "(top level)", " or ".join(useful)))
    return out
