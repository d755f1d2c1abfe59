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

from collections.abc import Callable
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
        message, problem = _decode_flat(message_type, plan, memoryview(data), message_type.__name__)
        if problem is not None:
            raise ValueError(problem)
        return message
    _check(message_type, memoryview(data), 0)
    try:
        message = message_type.FromString(data)
    except Exception as exc:  # the parser's own refusals (bad UTF-8, say)
        raise ValueError(cap(f"malformed {message_type.__name__}: {exc}", 200)) from exc
    _check_bounds(message, type(message).__name__)
    return message


# --- flat messages, read in one pass ----------------------------------------------------
#
# Every message of the protocol holds only strings, bytes, integers, booleans,
# enums (repeated ones among them), maps of strings to strings, oneofs, and
# messages made of those (a Timestamp among them). Such a message is read here in
# the same walk that checks it, and built with its constructor: betterproto2's
# parser would walk the bytes a second time at several times the cost (read that
# way, a switch's request was a third of an agent's CPU in a noop switch). The
# values are those the parser gives: the last of a singular field
# sent twice wins (a message field too), a repeated number is read packed or not,
# integers are masked and signed as their type says, an enum is its class's
# member, a Timestamp a datetime, a string must be UTF-8, a map's later entry for
# a key replaces an earlier one. A message field is flat when its type is, and a
# type that holds itself (at any depth) is not; such a type, or a field of another
# kind (a float, a map of other types), is read by the generic path instead.
# The same pass checks the bounds (`timeslice.api.bounds`) of the values it keeps,
# as `_check_bounds` checks a parsed message: a value a later one replaced is not
# checked, as it is not kept.

_NUMBERS: Final = frozenset(("int32", "int64", "uint32", "uint64", "bool", "enum"))
_FLAT_TYPES: Final = _NUMBERS | {"string", "bytes"}
# Read from a length-delimited field: "wrapped" is a well-known message type (a
# Timestamp) that the generated code shows as a Python value (a datetime), "map"
# a map of strings to strings.
_LEN_KINDS: Final = frozenset(("string", "bytes", "message", "wrapped", "map"))
# number -> (name, proto type, repeated, the field's enum class or message type,
# its oneof or None)
_FlatPlan = dict[int, tuple[str, str, bool, Any, str | None]]
_flat_plans: dict[type[Any], _FlatPlan | None] = {}
# The fields of a flat type that have bounds: name -> (the most items of a list or
# map, 0 for neither; the check of a string's value, None for a map; repeated).
_Bound = tuple[int, Callable[[str], str | None] | None, bool]
_flat_bounds: dict[type[Any], dict[str, _Bound]] = {}
# Types whose constructor warns of a deprecated field that is set (which a v1alpha1
# client still sends): built empty and filled in, as the parser builds them.
_filled: set[type[Any]] = set()


def _flat_plan(message_type: type[Any]) -> _FlatPlan | None:
    """How to read `message_type` in one pass; None unless it is flat."""
    if message_type in _flat_plans:
        return _flat_plans[message_type]
    _flat_plans[message_type] = None  # until known: a type that holds itself is not flat
    meta = message_type._betterproto
    plan: _FlatPlan | None = {}
    bounds: dict[str, _Bound] = {}
    for name, field in meta.meta_by_field_name.items():
        kind, nested = field.proto_type, meta.cls_by_field.get(name)
        if kind == "message":
            if field.unwrap is not None:  # a well-known type, shown as a Python value
                kind, nested = "wrapped", field.unwrap()
            flat = hasattr(nested, "_betterproto") and _flat_plan(nested) is not None
        elif kind == "map":
            flat = all(m.proto_type == "string" for m in field.map_meta or ())
        else:
            flat = kind in _FLAT_TYPES
        if not flat:
            plan = None
            break
        assert plan is not None
        plan[field.number] = (name, kind, field.repeated, nested, field.group)
        limit = _item_limit(name) if field.repeated or kind == "map" else 0
        check = _string_check(name) if kind == "string" else None
        if limit or check is not None:
            bounds[name] = (limit, check, field.repeated)
    if "__post_init__" in vars(message_type):
        _filled.add(message_type)
    _flat_bounds[message_type] = bounds
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


def _number(kind: str, enum: Any, value: int) -> Any:
    """A varint's value as a field of `kind` holds it (an `enum` member for an enum)."""
    number = _integer(kind, value)
    return enum(number) if kind == "enum" else number


def _decode_flat(
    message_type: type[_M], plan: _FlatPlan, data: memoryview, path: str
) -> tuple[_M, str | None]:
    """The message in `data` (ValueError if it is malformed) and the first bound it
    breaks (None: none), for `path` (where it is in the message read) to name."""
    values: dict[str, Any] = {}
    oneofs: dict[str, str] = {}  # oneof -> the member set
    # A singular message field -> the bound its (last) value breaks.
    inner: dict[str, str | None] = {}
    pos = 0
    while pos < len(data):
        number, wire, pos = _field_key(data, pos)
        known = plan.get(number)
        if known is None:
            pos = _span(data, pos, number, wire)[1]
            continue
        name, kind, repeated, nested, group = known
        if group is not None and oneofs.setdefault(group, name) != name:
            raise ValueError(
                f"{message_type.__name__}: {oneofs[group]} and {name} are both set,"
                f" but only one member of {group} may be"
            )
        if wire == _VARINT:
            if kind not in _NUMBERS:
                raise ValueError(f"field {name} has wire type {wire}, expected {_LEN}")
            value, pos = _varint(data, pos)
            item: Any = _number(kind, nested, value)
            if repeated:
                values.setdefault(name, []).append(item)
            else:
                values[name] = item
            continue
        pos, end = _span(data, pos, number, wire)
        if wire != _LEN:
            expected = _LEN if kind in _LEN_KINDS else _WIRE_TYPE[kind]
            raise ValueError(f"field {name} has wire type {wire}, expected {expected}")
        if kind in _NUMBERS:  # packed: only a repeated one may be
            if not repeated:
                raise ValueError(f"field {name} has wire type {wire}, expected {_VARINT}")
            items = values.setdefault(name, [])
            while pos < end:
                value, pos = _varint(data, pos)
                if pos > end:
                    raise ValueError(f"field {name}'s packed values run past their end")
                items.append(_number(kind, nested, value))
            continue
        if kind == "map":
            key, text = _map_entry(message_type, data[pos:end])
            values.setdefault(name, {})[key] = text
            pos = end
            continue
        if kind == "string":
            item = _text(message_type, data[pos:end])
        elif kind == "bytes":
            item = bytes(data[pos:end])
        else:
            item, problem = _decode_flat(
                nested, _flat_plans[nested] or {}, data[pos:end], f"{path}.{name}"
            )
            if kind == "wrapped":
                try:
                    item = item.to_wrapped()
                except (OverflowError, ValueError) as exc:  # a date out of range
                    raise ValueError(f"field {name} is out of range: {exc}") from None
            if not repeated:
                inner[name] = problem
            elif problem is not None:  # every item is kept
                raise ValueError(problem)
        if repeated:
            values.setdefault(name, []).append(item)
        else:
            values[name] = item
        pos = end
    problem = _bound_broken(_flat_bounds[message_type], values, path) or next(
        (p for p in inner.values() if p is not None), None
    )
    if message_type in _filled:
        message = message_type()
        for name, value in values.items():
            setattr(message, name, value)
        return message, problem
    return message_type(**values), problem


def _bound_broken(bounds: dict[str, _Bound], values: dict[str, Any], path: str) -> str | None:
    """The first bound that the fields read (`values`) break, as `_check_bounds`
    words it; None if they keep them all."""
    for name, value in values.items():
        bound = bounds.get(name)
        if bound is None:
            continue
        limit, check, repeated = bound
        if limit and len(value) > limit:
            return f"{path}.{name} has more than {limit} items"
        if check is not None:
            for item in value if repeated else (value,):
                if (problem := check(item)) is not None:
                    return f"{path}.{name} {problem}"
        elif not repeated:  # a map of names to text
            for key, text in value.items():
                if (problem := id_problem(key) or text_problem(text)) is not None:
                    return f"{path}.{name} has an entry that {problem}"
    return None


def _text(message_type: type[Any], data: memoryview) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(cap(f"malformed {message_type.__name__}: {exc}", 200)) from exc


def _map_entry(message_type: type[Any], data: memoryview) -> tuple[str, str]:
    """The key and value of one entry of a map of strings to strings."""
    key = value = ""
    pos = 0
    while pos < len(data):
        number, wire, pos = _field_key(data, pos)
        pos, end = _span(data, pos, number, wire)
        if number in (1, 2):
            if wire != _LEN:
                raise ValueError(f"a map entry's field {number} has wire type {wire}")
            if number == 1:
                key = _text(message_type, data[pos:end])
            else:
                value = _text(message_type, data[pos:end])
        pos = end
    return key, value


def _item_limit(name: str) -> int:
    """The most items the list or map field `name` may hold."""
    return MAX_ITEMS_BY_FIELD.get(name, MAX_ITEMS)


def _string_check(name: str) -> Callable[[str], str | None]:
    """The check of the string field `name`: free text, or an id."""
    return text_problem if name in TEXT_FIELDS else id_problem


def _check_bounds(message: Any, path: str) -> None:
    meta = message._betterproto
    for name, field in meta.meta_by_field_name.items():
        value = getattr(message, name, None)
        if value is None:
            continue
        where = f"{path}.{name}"
        if field.repeated or field.proto_type == "map":
            limit = _item_limit(name)
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
            check = _string_check(name)
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
            # A map's entries are messages too (a key, a value).
            is_message = field.proto_type in ("message", "map")
            if wire == _LEN and is_message and hasattr(nested, "_betterproto"):
                _check(nested, data[pos:end], depth + 1)
        pos = end
