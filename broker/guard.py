"""A length check of a request body before kio parses it.

In: a kio request schema, the frame and the offset where the body starts.
Out: nothing when every array, string and bytes length in the body fits in
the bytes that remain; `GuardError` naming the field otherwise.

Why: kio's native reader reserves memory for an array from the length on
the wire before reading its elements, and a failed allocation in native
code aborts the whole process. One forged length (2**35 elements) would
kill the broker and every connection with it. Walking the body once with
the schema and refusing impossible lengths keeps a malformed request the
problem of its own connection only.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing

FIXED = {
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "uint32": 4,
    "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class GuardError(ValueError):
    pass


def _uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise GuardError("a varint runs past the end of the frame")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise GuardError("a varint is longer than 5 bytes")


def _unwrap(tp):
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


@functools.cache
def _plan(cls) -> tuple[list, dict]:
    """(regular fields, tagged fields by tag): each (name, kind, element type or kafka type)."""
    regular, tagged = [], {}
    for f in dataclasses.fields(cls):
        tp = _unwrap(f.type)
        kafka_type = f.metadata.get("kafka_type")
        if typing.get_origin(tp) is tuple:
            elem = _unwrap(typing.get_args(tp)[0])
            entry = (f.name, "array", elem if dataclasses.is_dataclass(elem) else kafka_type)
        elif dataclasses.is_dataclass(tp):
            nullable = tp is not f.type  # X | None: a presence byte comes first
            entry = (f.name, "nullable-entity" if nullable else "entity", tp)
        else:
            entry = (f.name, "value", kafka_type)
        if "tag" in f.metadata:
            tagged[f.metadata["tag"]] = entry
        else:
            regular.append(entry)
    return regular, tagged


def _length(buf: bytes, pos: int, end: int, flexible: bool, wide: bool, what: str) -> tuple[int, int]:
    """A string/bytes/array length: -1 for null."""
    if flexible:
        n, pos = _uvarint(buf, pos, end)
        n -= 1
    else:
        size = 4 if wide else 2
        if pos + size > end:
            raise GuardError(f"{what}: length runs past the end of the frame")
        n = (_I32 if wide else _I16).unpack_from(buf, pos)[0]
        pos += size
    if n < -1:
        raise GuardError(f"{what}: negative length {n}")
    if n > end - pos:
        raise GuardError(f"{what}: length {n} exceeds the {end - pos} bytes left in the frame")
    return n, pos


def _value(kafka_type: str, buf: bytes, pos: int, end: int, flexible: bool, what: str) -> int:
    size = FIXED.get(kafka_type)
    if size is not None:
        return pos + size
    if kafka_type in ("string", "bytes", "records"):
        n, pos = _length(buf, pos, end, flexible, kafka_type != "string", what)
        return pos + max(n, 0)
    if kafka_type in ("varint", "varlong", "uvarint", "uvarlong"):
        _, pos = _uvarint(buf, pos, end)
        return pos
    raise GuardError(f"{what}: cannot check a field of type {kafka_type!r}")


def _field(entry, buf: bytes, pos: int, end: int, flexible: bool, path: str) -> int:
    name, kind, sub = entry
    what = f"{path}.{name}"
    if kind == "nullable-entity":
        if pos >= end:
            raise GuardError(f"{what}: presence byte runs past the end of the frame")
        if buf[pos] == 0xFF:
            return pos + 1
        return check_entity(sub, buf, pos + 1, end, what)
    if kind == "entity":
        return check_entity(sub, buf, pos, end, what)
    if kind == "array":
        n, pos = _length(buf, pos, end, flexible, True, what)
        for i in range(max(n, 0)):
            if dataclasses.is_dataclass(sub):
                pos = check_entity(sub, buf, pos, end, f"{what}[{i}]")
            else:
                pos = _value(sub, buf, pos, end, flexible, f"{what}[{i}]")
            if pos > end:
                raise GuardError(f"{what}[{i}] runs past the end of the frame")
        return pos
    return _value(sub, buf, pos, end, flexible, what)


def check_entity(cls, buf: bytes, pos: int, end: int, path: str = "") -> int:
    """Walk one struct of `cls` from `pos`; return the position after it."""
    flexible = cls.__flexible__
    regular, tagged = _plan(cls)
    path = path or cls.__name__
    for entry in regular:
        pos = _field(entry, buf, pos, end, flexible, path)
        if pos > end:
            raise GuardError(f"{path}.{entry[0]} runs past the end of the frame")
    if flexible:
        count, pos = _uvarint(buf, pos, end)
        if count > end - pos:
            raise GuardError(f"{path}: {count} tagged fields cannot fit in {end - pos} bytes")
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end)
            size, pos = _uvarint(buf, pos, end)
            if size > end - pos:
                raise GuardError(f"{path}: tagged field {tag} of {size} bytes exceeds the frame")
            if tag in tagged:
                _field(tagged[tag], buf, pos, pos + size, flexible, path)
            pos += size
    return pos
