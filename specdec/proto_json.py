"""Wire messages as JSON-ready dicts, the one converter of the HTTP API (``specdec`` extension:
``stats``, ``trace``), the CLI's JSON output and the Python client: field names as in the protos,
keys in field-number order, 64-bit integers as numbers, enums by name.

protobuf's own JSON mapping (``MessageToDict``) writes int64/uint64 fields as strings (proto3's JSON
mapping, for JavaScript's 53-bit numbers); our counters (``wire_bytes``, ``target_computed_tokens``,
...) stay far below 2**53, and a client comparing them with the HTTP API's numbers should not have
to convert. Everything else is ``MessageToDict``'s: a double that is NaN or infinite is the string
"NaN" / "Infinity" (valid JSON, where ``json.dumps`` of the float would not be), bytes are base64,
an unset message field is left out.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

_INT64_TYPES = frozenset({
    FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64,
})


def message_to_dict(message: Message, all_fields: bool = False) -> dict[str, Any]:
    """``message`` as a dict: proto field names in field order, int64 fields as ints; with ``all_fields``
    also the fields left at their default (those without presence)."""
    data = MessageToDict(message, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=all_fields)
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
        if isinstance(value, dict):      # well-known types (Struct, Timestamp...) keep their JSON form
            _normalise(field.message_type, value)
        return value
    return int(value) if field.type in _INT64_TYPES else value
