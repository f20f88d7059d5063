"""Wire messages as JSON-ready dicts, the way the HTTP API prints them: field names as in the protos,
64-bit integers as numbers.

protobuf's own JSON mapping (``MessageToDict``) writes int64/uint64 fields as strings (proto3's JSON
mapping, for JavaScript's 53-bit numbers); our counters (``wire_bytes``, ``target_computed_tokens``,
...) stay far below 2**53, and a client comparing them with the HTTP API's numbers should not have
to convert.
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
    """``message`` as a dict: proto field names, int64 fields as ints; with ``all_fields`` also the
    fields left at their default (those without presence)."""
    data = MessageToDict(message, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=all_fields)
    _int64_as_numbers(message.DESCRIPTOR, data)
    return data


def _int64_as_numbers(descriptor: Descriptor, data: dict[str, Any]) -> None:
    """Turn the int64 fields of ``data`` (MessageToDict output of a ``descriptor`` message) into ints, in place."""
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


def _converted(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        if isinstance(value, dict):      # well-known types (Struct, Timestamp...) keep their JSON form
            _int64_as_numbers(field.message_type, value)
        return value
    return int(value) if field.type in _INT64_TYPES else value
