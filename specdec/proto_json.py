"""Wire messages as JSON-ready dicts, the one converter of the HTTP API (``specdec`` extension:
``stats``, ``trace``), the CLI's JSON output and the Python client: field names as in the protos,
keys in field-number order, 64-bit integers as numbers, enums by name.

protobuf's own JSON mapping (``MessageToDict``) writes int64/uint64 fields as strings (proto3's JSON
mapping, for JavaScript's 53-bit numbers); our counters (``wire_bytes``, ``target_computed_tokens``,
...) stay far below 2**53, and a client comparing them with the HTTP API's numbers should not have
to convert. Everything else is ``MessageToDict``'s: a double that is NaN or infinite is the string
"NaN" / "Infinity" (valid JSON, where ``json.dumps`` of the float would not be), bytes are base64,
an unset message field is left out.

Two things every output shares (the HTTP API, ``specdec generate --json``, the Python client), each
made by one function here: the stats (``stats_dict``: every ``Stats`` field, zeros too) and the
finish names (``finish_reason``: OpenAI's ``stop`` / ``length``; ``finish_detail``: which end it was,
the ``FinishReason`` name without its prefix: ``eos``, ``stop`` (a stop string), ``length``,
``context``, ``cancelled``).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from specdec.v1 import orchestrator_pb2 as pb

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


FINISH_PREFIX = "FINISH_REASON_"
FINISH_DETAILS = {value: name.removeprefix(FINISH_PREFIX).lower() for name, value in pb.FinishReason.items()}
FINISH_BY_DETAIL = {name: value for value, name in FINISH_DETAILS.items()}
# OpenAI knows "stop" (a natural end or a stop string) and "length" (the token limit or the context's end).
OPENAI_FINISH: dict[int, str] = {
    pb.FINISH_REASON_EOS: "stop",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CONTEXT: "length",
    pb.FINISH_REASON_CANCELLED: "stop",
    pb.FINISH_REASON_UNSPECIFIED: "stop",
}


def finish_reason(value: int) -> str:
    """OpenAI's finish_reason of a FinishReason value."""
    return OPENAI_FINISH.get(value, OPENAI_FINISH[pb.FINISH_REASON_UNSPECIFIED])


def finish_detail(value: int) -> str:
    """Which end a FinishReason value is: its name without the prefix, lower case."""
    return FINISH_DETAILS.get(value, FINISH_DETAILS[pb.FINISH_REASON_UNSPECIFIED])


def stats_dict(stats: Message) -> dict[str, Any]:
    """A Stats message as every output gives it: every field in field order, zeros too."""
    return message_to_dict(stats, all_fields=True)


def generation_dict(response: Message) -> dict[str, Any]:
    """A GenerateResponse as `specdec generate --json` prints it: every field, the stats by ``stats_dict``,
    ``finish_reason`` by its OpenAI name followed by ``finish_detail``."""
    data = message_to_dict(response, all_fields=True)
    data.update(usage=message_to_dict(response.usage, all_fields=True), stats=stats_dict(response.stats))
    out: dict[str, Any] = {}
    for fd in response.DESCRIPTOR.fields:
        if fd.name == "finish_reason":
            out.update(
                finish_reason=finish_reason(response.finish_reason), finish_detail=finish_detail(response.finish_reason)
            )
        elif fd.name in data:
            out[fd.name] = data[fd.name]
    return out


def message_to_dict(message: Message, all_fields: bool = False) -> dict[str, Any]:
    """``message`` as a dict: proto field names in field order, int64 fields as ints; with ``all_fields``
    also the fields left at their default (those without presence)."""
    data = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=all_fields)
    _normalise(message.DESCRIPTOR, data)
    return data


def _normalise(descriptor: Descriptor, data: dict[str, Any]) -> None:
    """Turn the int64 fields of ``data`` (MessageToDict output of a ``descriptor`` message) into ints and
    put its keys in field order, in place (nested messages too)."""
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                value[key] = _converted(value_field, item)
        else:
            data[field.name] = [_converted(field, v) for v in value] if field.is_repeated else _converted(field, value)
    ordered = [(field.name, data.pop(field.name)) for field in descriptor.fields if field.name in data]
    data.update(ordered)


def _converted(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        if isinstance(value, dict):  # well-known types (Struct, Timestamp...) keep their JSON form
            _normalise(field.message_type, value)
        return value
    return int(value) if field.type in _INT64_TYPES else value
