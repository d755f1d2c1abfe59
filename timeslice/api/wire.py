"""Strict reading of protobuf messages at the service edge.

The generated message classes parse leniently: a truncated field or a field of
the wrong wire type comes back as a half-filled message. A server must refuse
such input instead, so `decode_strict` walks the wire format first and raises
`ValueError` on anything malformed. Unknown fields are allowed (a newer client
may send them) as long as they are well formed. Two members of one oneof are
refused (the parser would silently keep the last), and so is every string or
repeated field out of its bounds (`timeslice.api.bounds`). No error message
repeats what the caller sent.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import betterproto2

from timeslice.api.bounds import (
    MAX_ITEMS,
    MAX_ITEMS_BY_FIELD,
    TEXT_FIELDS,
    cap,
    id_problem,
    text_problem,
)

_M = TypeVar("_M", bound=betterproto2.Message)

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_WIRE_TYPE: Final[dict[str, int]] = {
    **dict.fromkeys(
        ("int32", "int64", "uint32", "uint64", "sint32", "sint64", "bool", "enum"), _VARINT
    ),
    **dict.fromkeys(("fixed64", "sfixed64", "double"), _I64),
    **dict.fromkeys(("fixed32", "sfixed32", "float"), _I32),
    **dict.fromkeys(("string", "bytes", "message", "map"), _LEN),
}
_MAX_DEPTH: Final = 32


def decode_strict(message_type: type[_M], data: bytes) -> _M:
    """Parse `data` as `message_type`, raising ValueError if it is malformed."""
    plan = _flat_plan(message_type)
    if plan is not None:
        message = _decode_flat(message_type, plan, memoryview(data))
    else:
        _check(message_type, memoryview(data), 0)
        try:
            message = message_type.FromString(data)
        except Exception as exc:  # the parser's own refusals (bad UTF-8, say)
            raise ValueError(cap(f"malformed {message_type.__name__}: {exc}", 200)) from exc
    _check_bounds(message, type(message).__name__)
    return message


# --- flat messages, read in one pass ----------------------------------------------------
#
# Most messages on the hot paths (every Acquire, Yield and KeepAlive and their
# answers, every switch's answer) hold only strings, integers, booleans, enums, and
# messages made of those (a Timestamp among them). Such a
# message is read here in the same walk that checks it, and built with its
# constructor: betterproto2's parser would walk the bytes a second time at several
# times the cost. The values are those the parser gives: the last of a repeated
# scalar (or of a message field sent twice) wins, integers are masked and signed as
# their type says, an enum is its class's member, a Timestamp a datetime, a string
# must be UTF-8. A message field is flat when its type is, and a type that holds
# itself (at any depth) is not.

_FLAT_TYPES: Final = frozenset(("string", "int32", "int64", "uint32", "uint64", "bool", "enum"))
# Read from a length-delimited field: "wrapped" is a well-known message type (a
# Timestamp) that the generated code shows as a Python value (a datetime).
_LEN_KINDS: Final = frozenset(("string", "message", "wrapped"))
# number -> (name, proto type, repeated, the field's enum class or message type)
_FlatPlan = dict[int, tuple[str, str, bool, Any]]
_flat_plans: dict[type[Any], _FlatPlan | None] = {}


def _flat_plan(message_type: type[Any]) -> _FlatPlan | None:
    """How to read `message_type` in one pass; None unless it is flat."""
    if message_type in _flat_plans:
        return _flat_plans[message_type]
    _flat_plans[message_type] = None  # until known: a type that holds itself is not flat
    meta = message_type._betterproto
    plan: _FlatPlan | None = {}
    for name, field in meta.meta_by_field_name.items():
        kind, nested = field.proto_type, meta.cls_by_field.get(name)
        if kind == "message":
            if field.unwrap is not None:  # a well-known type, shown as a Python value
                kind, nested = "wrapped", field.unwrap()
            flat = hasattr(nested, "_betterproto") and _flat_plan(nested) is not None
        else:
            flat = kind in _FLAT_TYPES and not (field.repeated and kind != "string")
        if not flat or field.group is not None:
            plan = None
            break
        assert plan is not None
        plan[field.number] = (name, kind, field.repeated, nested)
    _flat_plans[message_type] = plan
    return plan


def _integer(kind: str, value: int) -> int | bool:
    if kind == "bool":
        return value > 0
    if kind in ("uint32", "uint64"):
        return value & (0xFFFFFFFF if kind == "uint32" else 0xFFFFFFFFFFFFFFFF)
    bits = 32 if kind == "int32" else 64  # an enum as an int64
    value &= (1 << bits) - 1
    sign = 1 << (bits - 1)
    return (value ^ sign) - sign


def _decode_flat(message_type: type[_M], plan: _FlatPlan, data: memoryview) -> _M:
    values: dict[str, Any] = {}
    pos = 0
    while pos < len(data):
        number, wire, pos = _field_key(data, pos)
        known = plan.get(number)
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            if known is not None:
                name, kind, _, nested = known
                if kind in _LEN_KINDS:
                    raise ValueError(f"field {name} has wire type {wire}, expected {_LEN}")
                number_value = _integer(kind, value)
                values[name] = nested(number_value) if kind == "enum" else number_value
            continue
        pos, end = _span(data, pos, number, wire)
        if known is not None:
            name, kind, repeated, nested = known
            if kind not in _LEN_KINDS or wire != _LEN:
                expected = _LEN if kind in _LEN_KINDS else _WIRE_TYPE[kind]
                raise ValueError(f"field {name} has wire type {wire}, expected {expected}")
            if kind != "string":
                item: Any = _decode_flat(nested, _flat_plans[nested] or {}, data[pos:end])
                if kind == "wrapped":
                    try:
                        item = item.to_wrapped()
                    except (OverflowError, ValueError) as exc:  # a date out of range
                        raise ValueError(f"field {name} is out of range: {exc}") from None
            else:
                try:
                    item = str(data[pos:end], "utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(cap(f"malformed {message_type.__name__}: {exc}", 200)) from exc
            if repeated:
                values.setdefault(name, []).append(item)
            else:
                values[name] = item
        pos = end
    return message_type(**values)


def _check_bounds(message: Any, path: str) -> None:
    meta = message._betterproto
    for name, field in meta.meta_by_field_name.items():
        value = getattr(message, name, None)
        if value is None:
            continue
        where = f"{path}.{name}"
        if field.repeated or field.proto_type == "map":
            limit = MAX_ITEMS_BY_FIELD.get(name, MAX_ITEMS)
            if len(value) > limit:
                raise ValueError(f"{where} has more than {limit} items")
            items = value
        else:
            items = (value,)
        if field.proto_type == "map":  # names to text (a backend's options)
            for key, item in value.items():
                problem = (id_problem(key) if isinstance(key, str) else None) or (
                    text_problem(item) if isinstance(item, str) else None
                )
                if problem is not None:
                    raise ValueError(f"{where} has an entry that {problem}")
                if isinstance(item, betterproto2.Message):
                    _check_bounds(item, where)
            continue
        if field.proto_type == "string":
            check = text_problem if name in TEXT_FIELDS else id_problem
            for item in items:
                if (problem := check(item)) is not None:
                    raise ValueError(f"{where} {problem}")
        elif field.proto_type == "message":
            for item in items:
                if isinstance(item, betterproto2.Message):
                    _check_bounds(item, where)


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def _field_key(data: memoryview, pos: int) -> tuple[int, int, int]:
    """The field number and wire type of the key at `pos`, and where the key ends."""
    key, pos = _varint(data, pos)
    if key >> 3 == 0:
        raise ValueError("field number 0")
    return key >> 3, key & 7, pos


def _span(data: memoryview, pos: int, number: int, wire: int) -> tuple[int, int]:
    """Where the value of field `number`, of wire type `wire`, whose key ends at
    `pos`, starts and ends (a length-delimited one: after its length)."""
    if wire == _VARINT:
        _, end = _varint(data, pos)
        return end, end
    if wire in (_I64, _I32):
        end = pos + (8 if wire == _I64 else 4)
    elif wire == _LEN:
        size, pos = _varint(data, pos)
        end = pos + size
    else:
        raise ValueError(f"unsupported wire type {wire} (field {number})")
    if end > len(data):
        raise ValueError(f"field {number} runs past the end of the message")
    return pos, end


def _check(message_type: type[Any], data: memoryview, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError("message nested too deeply")
    meta = message_type._betterproto
    by_number = {m.number: (name, m) for name, m in meta.meta_by_field_name.items()}
    oneof_seen: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        number, wire, pos = _field_key(data, pos)
        pos, end = _span(data, pos, number, wire)
        known = by_number.get(number)
        if known is not None:
            name, field = known
            if field.group is not None:
                other = oneof_seen.setdefault(field.group, name)
                if other != name:
                    raise ValueError(
                        f"{message_type.__name__}: {other} and {name} are both set,"
                        f" but only one member of {field.group} may be"
                    )
            expected = _WIRE_TYPE.get(field.proto_type)
            packed = field.repeated and wire == _LEN and expected != _LEN
            if expected is not None and wire != expected and not packed:
                raise ValueError(f"field {name} has wire type {wire}, expected {expected}")
            nested = meta.cls_by_field.get(name)
            if wire == _LEN and field.proto_type == "message" and hasattr(nested, "_betterproto"):
                _check(nested, data[pos:end], depth + 1)
        pos = end
