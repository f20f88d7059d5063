"""Checks every OpenAI request body passes before it becomes a GenerateRequest (all ApiError 400).

The request models (http_gateway/protocol.py) check types and shapes; around them, central
rather than one `if` per field:
  * `check_strings` walks the whole body once: a lone surrogate (JSON "\\ud800") in any string,
    key or value, known field or not, is refused naming its path (protobuf strings are UTF-8,
    which cannot carry one);
  * `check_unsupported` refuses the OpenAI features this server does not implement (tools,
    response_format, logit_bias, ...) instead of silently ignoring them; other unknown keys
    are ignored, as OpenAI clients send many optional ones;
  * `validated` runs a request model and turns its first error into a BadField naming the field
    as the client wrote it (`messages[0].content`, `specdec.k`);
  * `assign` is the one way a value reaches a proto field: the field's own wire range
    (int32 / uint32 / int64 / uint64, float32) is read from its descriptor, so a new proto field
    is range-checked without new code here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

_INT_RANGES = {  # proto integer type -> (name, lowest, highest)
    FieldDescriptor.CPPTYPE_INT32: ("int32", -(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_UINT32: ("uint32", 0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_INT64: ("int64", -(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT64: ("uint64", 0, 2**64 - 1),
}
FLOAT32_MAX = 3.4028234663852886e38
SURROGATES = range(0xD800, 0xE000)


def _harmless_none(value: Any) -> bool:
    return value is None or value == "none"


def _harmless_text_format(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "text")


def _harmless_text_modality(value: Any) -> bool:
    return value is None or value == ["text"]


def _harmless_empty(value: Any) -> bool:
    return value is None or value in ({}, [], "")


# OpenAI (and vLLM) fields that would change the answer and that this server does not implement:
# name -> "the value changes nothing" (then the field is accepted). Anything else -> 400 naming it.
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "tools": _harmless_empty,
    "functions": _harmless_empty,
    "tool_choice": _harmless_none,
    "function_call": _harmless_none,
    "response_format": _harmless_text_format,
    "logit_bias": _harmless_empty,
    "suffix": _harmless_empty,
    "audio": _harmless_empty,
    "modalities": _harmless_text_modality,
    "prediction": _harmless_empty,
    "web_search_options": _harmless_empty,
    "guided_json": _harmless_empty,
    "guided_regex": _harmless_empty,
    "guided_choice": _harmless_empty,
    "guided_grammar": _harmless_empty,
    "structured_outputs": _harmless_empty,
    "min_p": lambda v: v is None or v == 0,
    "length_penalty": lambda v: v is None or v == 1,
    "use_beam_search": lambda v: not v,
    "prompt_logprobs": lambda v: v is None,
}


class BadField(ValueError):
    """A request value that cannot be sent: message + the parameter path it concerns."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def check_unsupported(body: dict[str, Any]) -> None:
    """BadField for the first OpenAI feature that is asked for and not implemented here."""
    for name, harmless in UNSUPPORTED.items():
        if name in body and not harmless(body[name]):
            raise BadField(
                f"'{name}' is not supported by this server (speculative decoding of plain text); leave it out", name
            )


def lone_surrogate(text: str) -> bool:
    return any(ord(ch) in SURROGATES for ch in text)


def check_strings(body: Any) -> None:
    """BadField naming the first string (key or value, anywhere in the body) with a lone surrogate."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if lone_surrogate(value):
                raise BadField(
                    f"'{path or 'body'}' contains a lone UTF-16 surrogate (e.g. \\ud800), which is "
                    f"not valid Unicode text",
                    path or None,
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                sub = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and lone_surrogate(key):
                    raise BadField(f"a key in '{path or 'body'}' contains a lone UTF-16 surrogate", path or None)
                stack.append((item, sub))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))


def assign(message: Any, name: str, value: Any, param: str) -> None:
    """message.name = value, after checking value against the proto field's wire range."""
    fd = message.DESCRIPTOR.fields_by_name[name]
    bounds = _INT_RANGES.get(fd.cpp_type)
    if bounds is not None and not bounds[1] <= value <= bounds[2]:
        kind, low, high = bounds
        raise BadField(f"'{param}' is out of range: it must be in [{low}, {high}] ({kind}), got {value}", param)
    if fd.cpp_type in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
        try:
            value = float(value)
        except OverflowError:
            raise BadField(f"'{param}' is too large for a number", param) from None
        limit = FLOAT32_MAX if fd.cpp_type == FieldDescriptor.CPPTYPE_FLOAT else math.inf
        if not math.isfinite(value) or abs(value) > limit:
            raise BadField(f"'{param}' must be a finite number in the float32 range, got {value}", param)
    setattr(message, name, value)


Model = TypeVar("Model", bound=BaseModel)
_TYPE_NAMES = {
    "int_type": "int",
    "float_type": "float",
    "bool_type": "bool",
    "string_type": "str",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
}


def param_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the client wrote the field: ('messages', 0, 'content') -> messages[0].content."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def validated(model: type[Model], body: dict[str, Any]) -> Model:
    """body as `model`, or BadField for its first error (unknown extension fields: all of them, in one message)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        owner = extra[0]["loc"][:-1]
        names = sorted(str(e["loc"][-1]) for e in extra if e["loc"][:-1] == owner)
        known = ", ".join(sorted(_fields_at(model, owner)))
        raise BadField(
            f"unknown field(s) in '{param_path(owner)}': {', '.join(names)} (known: {known})",
            param_path((*owner, names[0])),
        )
    first = errors[0]
    param = param_path(first["loc"])
    raise BadField(f"'{param}' {_what(first)}", param)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) model at loc."""
    for name in loc:
        annotation = model.model_fields[name].annotation
        assert annotation is not None, "nested request models are annotated"
        model = annotation.__args__[0]  # `Sub | None`
    return list(model.model_fields)


def _what(error: ErrorDetails) -> str:
    """What is wrong with the value, after its quoted name."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]}, got {type(value).__name__}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}, got {value}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}, got {value}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        return "is not supported"
    return f"is invalid: {error['msg']}"
