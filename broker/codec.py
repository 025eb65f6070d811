"""Kafka wire protocol framing and (de)serialisation through kio.

In: one request frame (the bytes after the 4-byte size). Out: the request
header and the request payload as kio's dataclasses, or a `ProtocolError`
saying why the frame cannot be answered.

Responses: handlers describe a response as plain dicts and lists with the
field names of Kafka's schemas (snake case, as kio names them), written for
the newest version; `encode_response` fits them to the version the client
asked for, dropping fields the version lacks and defaulting the ones it has
but the dict leaves out. That keeps each handler one function for all
versions.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import types
import typing
import uuid
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from .guard import check_entity

API_VERSIONS_KEY = 18
_KEY_VERSION = struct.Struct(">hh")


class ProtocolError(Exception):
    """A frame that cannot be parsed; the connection is closed."""


class UnsupportedVersion(Exception):
    def __init__(self, api_key: int, version: int, correlation_id: int):
        super().__init__(f"api {api_key} version {version} is not supported")
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id


@dataclasses.dataclass
class Request:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any
    size: int


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, version, correlation_id) from the fixed start of every request header."""
    if len(frame) < 8:
        raise ProtocolError(f"a request frame of {len(frame)} bytes is shorter than a request header")
    api_key, version = _KEY_VERSION.unpack_from(frame, 0)
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    return api_key, version, correlation_id


def decode_request(frame: bytes, supported: dict[int, tuple[int, int]]) -> Request:
    """Parse a request frame. Raises UnsupportedVersion for a version outside
    `supported` (or an unknown API) and ProtocolError for a malformed frame."""
    api_key, version, correlation_id = peek_header(frame)
    low_high = supported.get(api_key)
    if low_high is None or not low_high[0] <= version <= low_high[1]:
        raise UnsupportedVersion(api_key, version, correlation_id)
    schema = load_request_schema(api_key, version)
    try:
        header, used = _reader(schema.__header_schema__)(frame, 0)
        check_entity(schema, frame, used, len(frame))
        body, used_body = _reader(schema)(frame, used)
    except (SerialError, KeyError, ValueError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        # KeyError: kio raises it for a tagged field it does not know.
        raise ProtocolError(f"malformed {schema.__name__} v{version}: {type(exc).__name__}: {exc}") from None
    # Bytes after the body are ignored, as Kafka's request parsing ignores them: librdkafka 2.x
    # sends an all-topics Metadata request with three stray bytes, which Kafka accepts.
    problem = _null_where_not_nullable(body)
    if problem:
        raise ProtocolError(f"malformed {schema.__name__} v{version}: {problem} is null, which it may not be")
    return Request(api_key, version, correlation_id, header.client_id, body, len(frame))


@functools.cache
def _array_fields(cls: type) -> tuple[tuple[str, bool, type | None], ...]:
    """For each array or entity field: name, whether null is allowed, the nested entity class."""
    out = []
    for f in dataclasses.fields(cls):
        tp = f.type
        nullable = False
        if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
            args = typing.get_args(tp)
            nullable = type(None) in args
            tp = next((a for a in args if a is not type(None)), tp)
        if typing.get_origin(tp) is tuple:
            out.append((f.name, nullable, _entity_arg(typing.get_args(tp)[0])))
        elif dataclasses.is_dataclass(tp):
            out.append((f.name, nullable, tp))
    return tuple(out)


def _null_where_not_nullable(entity, path: str = "") -> str | None:
    """kio reads a -1 length as null even where Kafka's schema forbids it; find such a field."""
    for name, nullable, sub in _array_fields(type(entity)):
        value = getattr(entity, name)
        where = f"{path}{name}"
        if value is None:
            if not nullable:
                return where
            continue
        if sub is None:
            continue
        for i, item in enumerate(value if isinstance(value, tuple) else (value,)):
            problem = _null_where_not_nullable(item, f"{where}[{i}].")
            if problem:
                return problem
    return None


@functools.cache
def _reader(cls):
    return entity_reader(cls)


@functools.cache
def _writer(cls):
    return entity_writer(cls)


# --- building responses -------------------------------------------------------


def _entity_arg(tp: Any) -> type | None:
    """The dataclass inside a field type: X, X | None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def _default_for(field: dataclasses.Field) -> Any:
    kafka_type = field.metadata.get("kafka_type")
    tp = field.type
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if type(None) in typing.get_args(tp):
            return None
    if typing.get_origin(tp) is tuple:
        return ()
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return None
    if kafka_type == "float64":
        return 0.0
    return 0


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, str, type | None, Any, bool], ...]:
    """For each field: name, kind, nested class, default, whether it has a default."""
    plan = []
    for f in dataclasses.fields(cls):
        tp = f.type
        if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
            # A nullable array: X[...] | None.
            tuples = [a for a in typing.get_args(tp) if typing.get_origin(a) is tuple]
            if tuples:
                tp = tuples[0]
        kind, sub = "plain", None
        if typing.get_origin(tp) is tuple:
            sub = _entity_arg(typing.get_args(tp)[0])
            kind = "entities" if sub else "plain"
        elif (sub := _entity_arg(tp)) is not None:
            kind = "entity"
        kt = f.metadata.get("kafka_type")
        if kt in ("timedelta_i32", "timedelta_i64"):
            kind = "timedelta"
        elif kt == "error_code":
            kind = "error"
        elif kt == "uuid":
            kind = "uuid"
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        plan.append((f.name, kind, sub, None if has_default else _default_for(f), has_default))
    return tuple(plan)


def build(cls: type, data: dict[str, Any]) -> Any:
    """Instantiate kio dataclass `cls` from a dict, recursively (see module doc)."""
    kwargs = {}
    for name, kind, sub, default, has_default in _plan(cls):
        if name not in data:
            if not has_default:
                kwargs[name] = default
            continue
        value = data[name]
        if kind == "entities":
            value = None if value is None else tuple(build(sub, item) for item in value)
        elif kind == "entity":
            value = None if value is None else build(sub, value)
        elif kind == "timedelta":
            if isinstance(value, int):
                value = datetime.timedelta(milliseconds=value)
        elif kind == "error":
            value = ErrorCode(int(value))
        elif kind == "uuid":
            value = None if value is None else (value if isinstance(value, uuid.UUID) else uuid.UUID(value))
        kwargs[name] = value
    return cls(**kwargs)


def encode_response(api_key: int, version: int, correlation_id: int, data: dict[str, Any]) -> bytes:
    """A complete response frame, size prefix included."""
    schema = load_response_schema(api_key, version)
    body = build(schema, data)
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    # ApiVersions responses always use header v0, so that a client that does
    # not yet know the broker's versions can read them.
    if schema.__header_schema__ is ResponseHeaderV1 and api_key != API_VERSIONS_KEY:
        _writer(ResponseHeaderV1)(buf, ResponseHeaderV1(correlation_id=correlation_id))
    else:
        _writer(ResponseHeaderV0)(buf, ResponseHeaderV0(correlation_id=correlation_id))
    _writer(schema)(buf, body)
    out = buf.getbuffer()
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def encode_request(payload: Any, correlation_id: int, client_id: str) -> bytes:
    """A request frame without its size prefix: the header the payload's version uses, then the payload."""
    header_cls = payload.__header_schema__
    fields = dict(request_api_key=payload.__api_key__, request_api_version=payload.__version__,
                  correlation_id=correlation_id)
    if "client_id" in header_cls.__dataclass_fields__:
        fields["client_id"] = client_id
    buf = io.BytesIO()
    _writer(header_cls)(buf, header_cls(**fields))
    _writer(type(payload))(buf, payload)
    return buf.getvalue()


def field_names(api_key: int, version: int) -> set[str]:
    return {f.name for f in dataclasses.fields(load_request_schema(api_key, version))}
