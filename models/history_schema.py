"""The history format as one table of rules (docs/history-format.md), and both readers built from it.

In: one line of `history.jsonl` (bytes), or, for Spark, the name of a parsed column.
Out, for Python (`parse_line`, `check_line`): the line as a dict, or a `LineProblem` naming the
field, what was expected and what was found. Out, for Spark (`spark_line_type`, `spark_bad`,
`spark_columns`, `JSON_OPTIONS`): the schema to parse a line with, one SQL predicate that is true
for every line the Python checks refuse, and the columns of an accepted line.

The table (`LINE` and the objects it nests) says, per field: its type, when it is required and
where it may appear. Python compiles it to checking functions; Spark compiles it to a schema (the
fields a JSON reader could coerce, `process`, `f`, `error`, `node`, `warning` and a send's
`error`, are read as variants, which keep their JSON type) and to SQL. Spark's JSON reader
(Jackson) is configured to refuse what Python refuses: NaN and Infinity, single quotes, nesting
deeper than MAX_DEPTH, numbers of more than MAX_NUMBER_DIGITS digits, a field that does not parse
as its type (no partial results); each line is parsed as `[<line>,{"<nonce>":1}]`, so a line that
is not exactly one JSON object cannot pass. Jackson's own limit on field names
(MAX_NAME_LENGTH) is Python's too. A line Spark flags is checked again by Python, whose words are
the error: the two readers accept the same lines and name the same problem.

The checks across lines (indices, time, one operation at a time per process, a crashed process
never used again, a completion's f) live in the readers, with their words here (`PROBLEMS`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A record's offset is below the largest long: one past the last record (where the log ends) is a
# long too, as in Kafka. So `offset + 1` never overflows.
OFFSET_MAX = INT64_MAX - 1
PARTITION_MAX = 2**31 - 1
MAX_DEPTH = 100  # arrays and objects, counting the line's own object
MAX_NUMBER_DIGITS = 1000  # an integer's digits; a fraction's digits before and after the point
MAX_NAME_LENGTH = 50_000  # characters of a field name (Jackson's limit)
TOPIC = r"[A-Za-z0-9._-]{1,249}"  # Kafka's topic names
KEY_PATTERN = TOPIC + r"/(?:0|[1-9][0-9]{0,9})"

TYPES = ("invoke", "ok", "fail", "info")
COMPLETIONS = ("ok", "fail", "info")
MOP_FUNCTIONS = ("send", "poll", "txn")
KEY_FUNCTIONS = ("assign", "subscribe")
CLIENT_FUNCTIONS = ("send", "poll", "txn", "assign", "subscribe", "crash", "final-reads", "process", "commit",
                    "committed")
OUTCOMES = ("reached", "unavailable", "timeout")
FORMAT = "docs/history-format.md"


CORRECT = "correct the field or remove the line"


class LineProblem(Exception):
    """What is wrong with one line: `field` (a path such as mops[0].offset, or None for the line
    as a whole) and `message` (what was expected, what was found, how to fix it). `syntax`: the
    line is not JSON at all (what a line cut short by a crash looks like)."""

    def __init__(self, field: str | None, message: str, syntax: bool = False):
        super().__init__(message)
        self.field = field
        self.message = message
        self.syntax = syntax


def found(v: Any) -> str:
    """A value as the line wrote it, with its JSON kind, for a message."""
    kind = ("null" if v is None else "a boolean" if isinstance(v, bool) else "an integer" if isinstance(v, int)
            else "a number" if isinstance(v, float) else "a string" if isinstance(v, str)
            else "a list" if isinstance(v, list) else "an object")
    if v is None:
        return "null"
    try:
        text = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(v)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


# --- where a field belongs ---------------------------------------------------------------------

@dataclass(frozen=True)
class Where:
    """A condition on the line: a client (not the nemesis) process, its f, its type."""

    client: bool | None = None
    fs: tuple[str, ...] | None = None
    types: tuple[str, ...] | None = None

    def py(self, op: dict) -> bool:
        return ((self.client is None or (op.get("process") != "nemesis") == self.client)
                and (self.fs is None or op.get("f") in self.fs)
                and (self.types is None or op.get("type") in self.types))

    def sql(self, line: str) -> str:
        parts = []
        if self.client is not None:
            parts.append(f"coalesce(try_variant_get({line}.process, '$', 'string') "
                         f"{'!=' if self.client else '='} 'nemesis', false)")
        if self.fs is not None:
            parts.append(f"coalesce(try_variant_get({line}.f, '$', 'string') IN ({_sql_list(self.fs)}), false)")
        if self.types is not None:
            parts.append(f"coalesce({line}.type IN ({_sql_list(self.types)}), false)")
        return "(" + " AND ".join(parts or ["true"]) + ")"

    def text(self) -> str:
        who = {None: "", True: "client ", False: "nemesis "}[self.client]
        what = (f"{' and '.join(', '.join(self.fs).rsplit(', ', 1))} operations" if self.fs
                else "operations")
        if self.types == COMPLETIONS:
            lines = "completions (ok, fail, info) of "
        elif self.types:
            lines = f"{' and '.join(', '.join(self.types).rsplit(', ', 1))} lines of "
        else:
            lines = "lines of "
        return f"on {lines}{who}{what}"


def _sql_list(items) -> str:
    return ", ".join(sql_str(i) for i in items)


def sql_str(s: str) -> str:
    """A Spark SQL string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- types -------------------------------------------------------------------------------------

_lambda_names = iter(f"x{i}" for i in range(1_000_000))


class Type:
    variant = False  # read by Spark as a variant (the JSON reader would coerce it otherwise)

    def compile(self) -> Callable[[Any, str, dict], None]:
        raise NotImplementedError

    def spark(self):
        raise NotImplementedError

    def sql_bad(self, x: str, line: str) -> str:
        """SQL: true when the (present) value `x` does not fit."""
        return "false"

    def sql_present(self, x: str) -> str:
        return f"{x} IS NOT NULL"

    def wrong(self, v: Any, path: str) -> LineProblem:
        return LineProblem(path, f"field {path}: expected {self.expect}, found {found(v)}; {CORRECT}")


@dataclass(eq=False)
class Integer(Type):
    lo: int
    hi: int
    expect: str

    def compile(self):
        lo, hi, wrong = self.lo, self.hi, self.wrong

        def check(v, path, op):
            if type(v) is not int or v < lo or v > hi:
                raise wrong(v, path)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.LongType()

    def sql_bad(self, x, line):
        parts = ([f"{x} < {self.lo}"] if self.lo > INT64_MIN else []) + ([f"{x} > {self.hi}"] if self.hi < INT64_MAX else [])
        return "(" + " OR ".join(parts) + ")" if parts else "false"


@dataclass(eq=False)
class Text(Type):
    expect: str = "a string"
    choices: tuple[str, ...] | None = None
    variant: bool = False

    def compile(self):
        choices, wrong = self.choices, self.wrong
        if choices is None:
            def check(v, path, op):
                if type(v) is not str:
                    raise wrong(v, path)
        else:
            allowed = frozenset(choices)

            def check(v, path, op):
                if type(v) is not str or v not in allowed:
                    raise wrong(v, path)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.VariantType() if self.variant else T.StringType()

    def sql_present(self, x):
        return f"({x} IS NOT NULL AND NOT is_variant_null({x}))" if self.variant else f"{x} IS NOT NULL"

    def sql_bad(self, x, line):
        s = f"try_variant_get({x}, '$', 'string')" if self.variant else x
        parts = [f"schema_of_variant({x}) != 'STRING'"] if self.variant else []
        if self.choices is not None:
            parts.append(f"NOT coalesce({s} IN ({_sql_list(self.choices)}), false)")
        return "(" + " OR ".join(parts) + ")" if parts else "false"


class KeyType(Type):
    expect = (f"a key: a string topic/partition, the topic of 1 to 249 letters, digits, '.', '_' or '-', the "
              f"partition a number from 0 to {PARTITION_MAX} without leading zeros (for example \"jepsen-0/2\")")
    _re = re.compile(KEY_PATTERN)

    def __init__(self):
        self._good: set[str] = set()

    def ok(self, v) -> bool:
        if type(v) is not str:  # before the cache: a list or an object is not hashable
            return False
        if v in self._good:
            return True
        if not self._re.fullmatch(v) or int(v.rsplit("/", 1)[1]) > PARTITION_MAX:
            return False
        if len(self._good) < 100_000:
            self._good.add(v)
        return True

    def compile(self):
        ok, wrong = self.ok, self.wrong

        def check(v, path, op):
            if not ok(v):
                raise wrong(v, path)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.StringType()

    def sql_bad(self, x, line):
        # \z: Java's $ would also match before a final newline.
        return (f"(NOT {x} RLIKE {sql_str('^' + KEY_PATTERN + chr(92) + 'z')} "
                f"OR try_cast(substring_index({x}, '/', -1) AS INT) IS NULL)")


class Boolean(Type):
    expect = "true or false (a JSON boolean, not a string or a number)"

    def compile(self):
        wrong = self.wrong

        def check(v, path, op):
            if v is not True and v is not False:
                raise wrong(v, path)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.BooleanType()


class AnyJSON(Type):
    expect = "any JSON value"

    def compile(self):
        def check(v, path, op):
            pass
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.StringType()  # the value's JSON text; a JSON string's own text, unquoted (Spark's reading)


class ProcessType(Type):
    expect = f"a non-negative integer (a client process) or the string \"nemesis\""
    variant = True

    def compile(self):
        wrong = self.wrong

        def check(v, path, op):
            if v != "nemesis" and (type(v) is not int or v < 0 or v > INT64_MAX):
                raise wrong(v, path)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.VariantType()

    def sql_present(self, x):
        return f"({x} IS NOT NULL AND NOT is_variant_null({x}))"

    def sql_bad(self, x, line):
        return (f"NOT coalesce((schema_of_variant({x}) = 'BIGINT' AND try_variant_get({x}, '$', 'bigint') >= 0) "
                f"OR (schema_of_variant({x}) = 'STRING' AND try_variant_get({x}, '$', 'string') = 'nemesis'), false)")


class FunctionType(Type):
    expect = "a non-empty string"
    variant = True
    client_expect = f"one of {', '.join(CLIENT_FUNCTIONS)} (the functions of a client operation)"

    def compile(self):
        allowed = frozenset(CLIENT_FUNCTIONS)
        expect, client_expect = self.expect, self.client_expect

        def check(v, path, op):
            if type(v) is not str or not v:
                raise LineProblem(path, f"field {path}: expected {expect}, found {found(v)}; {CORRECT}")
            if op.get("process") != "nemesis" and v not in allowed:
                raise LineProblem(path, f"field {path}: expected {client_expect}, found {found(v)}; a nemesis "
                                        f"operation has process \"nemesis\"")
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.VariantType()

    def sql_present(self, x):
        return f"({x} IS NOT NULL AND NOT is_variant_null({x}))"

    def sql_bad(self, x, line):
        s = f"try_variant_get({x}, '$', 'string')"
        return (f"(schema_of_variant({x}) != 'STRING' OR {s} = '' OR ({Where(client=True).sql(line)} "
                f"AND NOT coalesce({s} IN ({_sql_list(CLIENT_FUNCTIONS)}), false)))")


@dataclass(eq=False)
class ListOf(Type):
    item: Type
    expect: str

    def compile(self):
        item, wrong = self.item.compile(), self.wrong
        item_expect = self.item.expect

        def check(v, path, op):
            if type(v) is not list:
                raise wrong(v, path)
            for i, e in enumerate(v):
                if e is None:
                    raise LineProblem(f"{path}[{i}]", f"field {path}[{i}]: expected {item_expect}, found null; "
                                                      f"{CORRECT}")
                item(e, f"{path}[{i}]", op)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.ArrayType(self.item.spark())

    def sql_bad(self, x, line):
        e = next(_lambda_names)
        return f"exists({x}, {e} -> {e} IS NULL OR {self.item.sql_bad(e, line)})"


@dataclass(eq=False)
class MapOf(Type):
    key: Type
    value: Type
    expect: str

    def compile(self):
        key, value, wrong = self.key.compile(), self.value.compile(), self.wrong

        def check(v, path, op):
            if type(v) is not dict:
                raise wrong(v, path)
            for k, e in v.items():
                key(k, f"{path} (a name in it)", op)
                value(e, f"{path}[{json.dumps(k)}]", op)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.MapType(T.StringType(), self.value.spark())

    def sql_bad(self, x, line):
        k, e = next(_lambda_names), next(_lambda_names)
        return (f"(exists(map_keys({x}), {k} -> {self.key.sql_bad(k, line)}) "
                f"OR exists(map_values({x}), {e} -> {e} IS NULL OR {self.value.sql_bad(e, line)}))")


@dataclass(eq=False)
class Field:
    name: str
    type: Type
    # True, or a Where: when the field must be present (and not null).
    required: bool | Where = False
    # None (anywhere), or a Where: the only lines it may appear on (null counts as absent).
    allowed: Where | None = None
    # Why it is required, for the message; defaults to the Where's own words.
    why: str = ""


@dataclass(eq=False)
class Obj(Type):
    expect: str
    fields: list[Field]

    def compile(self):
        wrong = self.wrong
        compiled = []
        for fd in self.fields:
            compiled.append((fd.name, fd.type.compile(), fd.required, fd.allowed, fd.type.expect, fd.why))

        def check(v, path, op):
            if type(v) is not dict:
                raise wrong(v, path)
            for name, type_check, required, allowed, expect, why in compiled:
                x = v.get(name)
                where = f"{path}.{name}" if path else name
                if x is None:
                    if required is True or (required and required.py(op)):
                        what = "missing" if name not in v else "null"
                        need = why or (required.text() if required is not True else "always")
                        raise LineProblem(where, f"field {where} is {what}: it is required ({need}) and must be "
                                                 f"{expect}; add it, or remove the line")
                    continue
                if allowed is not None and not allowed.py(op):
                    raise LineProblem(where, f"field {where} does not belong on this line: it is only written "
                                             f"{allowed.text()}; remove it, or correct the line's process, f or type")
                type_check(x, where, op)
        return check

    def spark(self):
        from pyspark.sql import types as T
        return T.StructType([T.StructField(fd.name, fd.type.spark()) for fd in self.fields])

    def sql_bad(self, x, line):
        parts = []
        for fd in self.fields:
            col = f"{x}.{fd.name}"
            present = fd.type.sql_present(col)
            if fd.required is True:
                parts.append(f"NOT ({present})")
            elif fd.required:
                parts.append(f"(NOT ({present}) AND {fd.required.sql(line)})")
            bad = fd.type.sql_bad(col, line)
            if fd.allowed is not None:
                bad = f"NOT {fd.allowed.sql(line)} OR {bad}"
            if bad != "false":
                parts.append(f"(({present}) AND ({bad}))")
        return "(" + " OR ".join(parts) + ")" if parts else "false"


@dataclass(eq=False)
class Tagged(Type):
    """An object whose `f` says which of `variants` it is; the fields of the others must be absent."""

    expect: str
    variants: dict[str, Obj]

    def compile(self):
        compiled = {tag: obj.compile() for tag, obj in self.variants.items()}
        own = {tag: {fd.name for fd in obj.fields} for tag, obj in self.variants.items()}
        every = set().union(*own.values())
        foreign = {tag: sorted(every - names) for tag, names in own.items()}
        expect, tags = self.expect, " or ".join(f'"{t}"' for t in self.variants)

        def check(v, path, op):
            if type(v) is not dict:
                raise LineProblem(path, f"field {path}: expected {expect}, found {found(v)}; {CORRECT}")
            tag = v.get("f")
            if type(tag) is not str or tag not in compiled:
                raise LineProblem(f"{path}.f", f"field {path}.f: expected {tags}, found {found(tag)}; {CORRECT}")
            for name in foreign[tag]:
                if v.get(name) is not None:
                    raise LineProblem(f"{path}.{name}", f"field {path}.{name} does not belong on a {tag} "
                                                        f"micro-operation; remove it, or correct its f")
            compiled[tag](v, path, op)
        return check

    def spark(self):
        from pyspark.sql import types as T
        fields: dict[str, Any] = {}
        for obj in self.variants.values():
            for fd in obj.fields:
                fields.setdefault(fd.name, T.StructField(fd.name, fd.type.spark()))
        return T.StructType(list(fields.values()))

    def sql_bad(self, x, line):
        every = {fd.name: fd for obj in self.variants.values() for fd in obj.fields}
        parts = [f"NOT coalesce({x}.f IN ({_sql_list(self.variants)}), false)"]
        for tag, obj in self.variants.items():
            names = {fd.name for fd in obj.fields}
            foreign = [every[n].type.sql_present(f"{x}.{n}") for n in every if n not in names]
            parts.append(f"({x}.f = {sql_str(tag)} AND ({' OR '.join(foreign + [obj.sql_bad(x, line)])}))")
        return "(" + " OR ".join(parts) + ")"


# --- the table ---------------------------------------------------------------------------------

KEY = KeyType()
INT = Integer(INT64_MIN, INT64_MAX, f"an integer from {INT64_MIN} to {INT64_MAX} (a JSON integer: no fraction, "
                                    f"no exponent, not a string or a boolean)")
OFFSET = Integer(0, OFFSET_MAX, f"an offset: an integer from 0 to {OFFSET_MAX} (one past it, where the log "
                                f"ends, is a 64-bit integer too)")
END = Integer(0, INT64_MAX, f"an end offset: an integer from 0 to {INT64_MAX}")
TEXT = Text("a string", variant=True)
BOOL = Boolean()
CLIENT_MOPS = Where(client=True, fs=MOP_FUNCTIONS)
CLIENT_KEYS = Where(client=True, fs=KEY_FUNCTIONS)

RECORD = Obj("a record: an object {\"key\": key, \"offset\": offset, \"value\": integer}", [
    Field("key", KEY, required=True),
    Field("offset", OFFSET, required=True),
    Field("value", INT, required=True),
])
SEND = Obj("a send micro-operation", [
    Field("f", Text(choices=("send",))),
    Field("key", KEY, required=True),
    Field("value", INT, required=True),
    # Known on an ok completion; on an info one, for the records the broker acknowledged.
    Field("offset", OFFSET, allowed=Where(types=("ok", "info"))),
    # Why this record was not acknowledged.
    Field("error", Text("a string", variant=True)),
])
POLL = Obj("a poll micro-operation", [
    Field("f", Text(choices=("poll",))),
    Field("records", ListOf(RECORD, "a list of records"), allowed=Where(types=COMPLETIONS)),
])
MOP = Tagged("a micro-operation: an object with f \"send\" or \"poll\"", {"send": SEND, "poll": POLL})
REBALANCE_TYPES = ("assigned", "revoked", "lost")
REBALANCE = Obj("an object {\"keys\": [key, ...]}", [
    Field("keys", ListOf(KEY, "a list of keys"), required=True),
    # What the group did with them: gave them to this consumer, took them back, or took them
    # without asking (the member was fenced or its session expired).
    Field("type", Text(f"one of {', '.join(REBALANCE_TYPES)}", choices=REBALANCE_TYPES)),
])
FINAL_READ = Obj("an object {\"key\": key, \"end\": end offset or null, \"read_to\": offset, \"outcome\": ...}", [
    Field("key", KEY, required=True),
    Field("end", END),
    Field("read_to", END, required=True),
    Field("outcome", Text(f"one of {', '.join(OUTCOMES)}", choices=OUTCOMES), required=True),
])

LINE = Obj("a JSON object", [
    Field("index", Integer(0, INT64_MAX, "a non-negative integer (the line's position: 0, 1, 2, ...)"), required=True),
    Field("time", Integer(0, INT64_MAX, "a non-negative integer (nanoseconds since the test started)"),
          required=True),
    Field("process", ProcessType(), required=True),
    Field("type", Text(f"one of {', '.join(TYPES)}", choices=TYPES), required=True),
    Field("f", FunctionType(), required=True),
    Field("mops", ListOf(MOP, "a list of micro-operations"), required=CLIENT_MOPS, allowed=CLIENT_MOPS),
    Field("keys", ListOf(KEY, "a list of keys"), required=CLIENT_KEYS, allowed=CLIENT_KEYS),
    Field("seek_to_beginning", BOOL, allowed=CLIENT_KEYS),
    Field("rebalance_log", ListOf(REBALANCE, "a list of {\"keys\": [key, ...]} objects"),
          allowed=Where(client=True, fs=("poll", "txn"), types=COMPLETIONS)),
    Field("value", AnyJSON()),
    Field("error", TEXT),
    Field("node", TEXT),
    Field("warning", TEXT),
    Field("final", BOOL, allowed=Where(client=True)),
    Field("end_offsets", MapOf(KEY, END, "an object of key -> end offset"), allowed=Where(client=True, types=COMPLETIONS)),
    # On a process operation's completion: the records the consumer's application processed.
    Field("processed", ListOf(RECORD, "a list of records"), allowed=Where(client=True, fs=("process",),
                                                                           types=COMPLETIONS)),
    # On a commit's completion: the offsets it committed for the group (the next offset to read);
    # on a committed operation's: the group's committed offsets, as the broker said.
    Field("offsets", MapOf(KEY, END, "an object of key -> offset"),
          allowed=Where(client=True, fs=("commit", "committed"), types=COMPLETIONS)),
    # On a poll's completion: where the consumer found a key's end (the offset it reads next),
    # past what it never returns (transaction markers; aborted records under read_committed).
    Field("positions", MapOf(KEY, END, "an object of key -> offset"),
          allowed=Where(client=True, fs=("poll", "txn"), types=COMPLETIONS)),
    # On a final assign's completion: the keys whose end the broker could not say, and why.
    Field("unavailable", MapOf(KEY, TEXT, "an object of key -> why (a string)"),
          allowed=Where(client=True, types=COMPLETIONS)),
    Field("final_reads", ListOf(FINAL_READ, "a list of {key, end, read_to, outcome} objects"),
          required=Where(client=True, fs=("final-reads",), types=("ok",)),
          allowed=Where(client=True, fs=("final-reads",), types=COMPLETIONS)),
])
FIELD_NAMES = [fd.name for fd in LINE.fields]

_check_line = LINE.compile()


def check_line(op: Any) -> None:
    """Check one parsed line against the table; raises LineProblem."""
    if type(op) is not dict:
        raise LineProblem(None, f"a history line must be a JSON object, found {found(op)}; correct or remove the line")
    _check_line(op, "", op)


# --- JSON: one object a line, strict -----------------------------------------------------------

class _JSONLimit(Exception):
    pass


def _constant(name: str):
    raise _JSONLimit(f"{name} is not JSON (JSON has no NaN or Infinity): write a number or null")


def _int(text: str) -> int:
    if len(text) - (text[0] == "-") > MAX_NUMBER_DIGITS:
        raise _JSONLimit(f"a number of {len(text)} characters: numbers have at most {MAX_NUMBER_DIGITS} digits")
    return int(text)


def _float(text: str) -> float:
    mantissa = re.split("[eE]", text.lstrip("-"), maxsplit=1)[0]
    if len(mantissa) - ("." in mantissa) > MAX_NUMBER_DIGITS:
        raise _JSONLimit(f"a number of {len(text)} characters: numbers have at most {MAX_NUMBER_DIGITS} digits "
                         f"before and after the point together")
    return float(text)


def _pairs(pairs):
    for name, _ in pairs:
        if len(name) > MAX_NAME_LENGTH:
            raise _JSONLimit(f"a field name of {len(name)} characters: names have at most {MAX_NAME_LENGTH}")
    return dict(pairs)


def _depth(v: Any) -> int:
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if type(x) is dict:
            x = x.values()
        elif type(x) is not list:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((e, d + 1) for e in x if type(e) in (dict, list))
    return deepest


_DEPTH_PROBLEM = (f"nested deeper than {MAX_DEPTH} levels of arrays and objects (the line's own object is the "
                  f"first): flatten the value")


def parse_line(raw: bytes) -> Any:
    """One line's bytes (without its newline) -> its JSON value; raises LineProblem for bytes that
    are not UTF-8, text that is not exactly one JSON value, NaN or Infinity, or the limits."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineProblem(None, f"not UTF-8: byte {raw[exc.start]:#04x} at column {exc.start + 1} cannot start "
                                f"or continue a UTF-8 character; write the file in UTF-8", syntax=True) from None
    if not text.strip(" \t\r\n"):
        raise LineProblem(None, "empty line: every line is one JSON object; remove it", syntax=True)
    long = len(raw) > MAX_NUMBER_DIGITS
    try:
        if long:
            value = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float,
                               object_pairs_hook=_pairs if len(raw) > MAX_NAME_LENGTH else None)
        else:
            value = json.loads(text, parse_constant=_constant)
    except _JSONLimit as exc:
        raise LineProblem(None, f"bad JSON: {exc}", syntax=True) from None
    except RecursionError:
        raise LineProblem(None, f"bad JSON: {_DEPTH_PROBLEM}", syntax=True) from None
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unexpected UTF-8 BOM"):
            raise LineProblem(None, "bad JSON: a byte order mark (U+FEFF) that does not start the file; remove "
                                    "it (only the file's first line may start with one)", syntax=True) from None
        if exc.msg == "Extra data":
            raise LineProblem(None, f"bad JSON: more than one JSON value on the line (the first ends before column "
                                    f"{exc.colno}); a line holds exactly one JSON object", syntax=True) from None
        raise LineProblem(None, f"bad JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}; correct the JSON "
                                f"or remove the line",
                          syntax=True) from None
    except ValueError as exc:  # e.g. an integer too long for Python's int()
        raise LineProblem(None, f"bad JSON: {exc}", syntax=True) from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise LineProblem(None, f"bad JSON: {_DEPTH_PROBLEM}", syntax=True)
    return value


def line_problem(raw: bytes) -> LineProblem | None:
    """The problem of one line on its own (JSON and the table), or None."""
    try:
        check_line(parse_line(raw))
    except LineProblem as exc:
        return exc
    return None


# --- the checks across lines: their words, for both readers ------------------------------------

class PROBLEMS:
    @staticmethod
    def index(found_index: int, expected: int) -> tuple[str, str]:
        return "index", (f"field index: expected {expected}, found {found_index} (indices run 0, 1, 2, ... "
                         f"with no gaps, one per line); renumber the lines")

    @staticmethod
    def time(t: int, previous: int) -> tuple[str, str]:
        return "time", (f"field time: expected at least {previous} (the previous line's time: time never "
                        f"decreases), found {t}; lines must be in the order their events happened")

    @staticmethod
    def retired(process: Any, at: int) -> tuple[str, str]:
        return "process", (f"field process: process {process} crashed (its operation at index {at} ended info) "
                           f"and a crashed process's number is never used again; give this operation a new "
                           f"process number (Jepsen's convention: the old one plus the concurrency)")

    @staticmethod
    def open(process: Any, at: int) -> tuple[str, str]:
        return "process", (f"field process: process {process} invokes while its operation at index {at} has "
                           f"not completed (a process runs one operation at a time); complete that one first or "
                           f"use another process")

    @staticmethod
    def orphan(process: Any, type_: str) -> tuple[str, str]:
        return "type", (f"field type: a {type_} completion of process {process} with no invocation before it; "
                        f"add its invoke line, or correct the process")

    @staticmethod
    def f(f: str, invoked: str, at: int) -> tuple[str, str]:
        return "f", (f"field f: expected {invoked!r} (the f of its invocation at index {at}), found {f!r}; a "
                     f"completion repeats its invocation's f")


def fix(message: str) -> str:
    """A problem's message with where to read the format."""
    return f"{message} (the format: {FORMAT})"


# --- Spark -------------------------------------------------------------------------------------

# Jackson refuses what Python refuses. The line is parsed inside an array (one level deeper).
JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
    "allowNumericLeadingZeros": "false",
    "allowUnquotedFieldNames": "false",
    "allowComments": "false",
    "allowBackslashEscapingAnyCharacter": "false",
    "allowUnquotedControlChars": "false",
    "maxNestingDepth": str(MAX_DEPTH + 1),
    "maxNumLen": str(MAX_NUMBER_DIGITS),
    "maxStringLen": str(2**31 - 1),
}
# A field Spark must not fill from a partly parsed line.
SPARK_CONF = {"spark.sql.json.enablePartialResults": "false"}


def spark_line_type(nonce: str):
    """The schema of `[<line>,{"<nonce>":1}]`: an array of the line's struct plus the nonce field."""
    from pyspark.sql import types as T
    line = LINE.spark()
    return T.ArrayType(T.StructType(line.fields + [T.StructField(nonce, T.IntegerType())]))


def spark_wrap(nonce: str) -> tuple[str, str]:
    return "[", ',{"' + nonce + '":1}]'


def spark_bad(arr: str, line: str, text: str, nonce: str) -> str:
    """SQL: true for a line Python's checks refuse (`arr`: the parsed array, `line`: its first
    element, `text`: the line's text)."""
    exact = f"(size({arr}) = 2 AND get({arr}, 1).`{nonce}` = 1 AND {line}.`{nonce}` IS NULL)"
    return f"coalesce(NOT {exact} OR NOT is_valid_utf8({text}) OR {LINE.sql_bad(line, line)}, true)"


def _spark_out(t: Type):
    """The type of a field as the loader exposes it: variants as strings."""
    from pyspark.sql import types as T
    if isinstance(t, (Text, FunctionType)) and t.variant or isinstance(t, ProcessType):
        return T.StringType()
    if isinstance(t, ListOf):
        return T.ArrayType(_spark_out(t.item))
    if isinstance(t, MapOf):
        return T.MapType(T.StringType(), _spark_out(t.value))
    if isinstance(t, (Obj, Tagged)):
        fields = {}
        for obj in ([t] if isinstance(t, Obj) else t.variants.values()):
            for fd in obj.fields:
                fields.setdefault(fd.name, T.StructField(fd.name, _spark_out(fd.type)))
        return T.StructType(list(fields.values()))
    return t.spark()


def spark_field_type(name: str):
    """The Spark type of a line field as the loader exposes it (variants as strings)."""
    return _spark_out(next(fd.type for fd in LINE.fields if fd.name == name))


def spark_columns(line: str) -> list[str]:
    """SQL: the columns of an accepted line, named as its fields; `process` as text (the integer
    in decimal, or "nemesis"), the other variants as their strings."""
    out = []
    for fd in LINE.fields:
        col = f"{line}.{fd.name}"
        if isinstance(fd.type, ProcessType):
            out.append(f"CASE WHEN schema_of_variant({col}) = 'BIGINT' THEN CAST(try_variant_get({col}, '$', "
                       f"'bigint') AS STRING) ELSE try_variant_get({col}, '$', 'string') END AS {fd.name}")
        elif fd.type.variant:
            out.append(f"try_variant_get({col}, '$', 'string') AS {fd.name}")
        elif isinstance(fd.type, MapOf) and fd.type.value.variant:
            out.append(f"transform_values({col}, (k, v) -> try_variant_get(v, '$', 'string')) AS {fd.name}")
        elif _spark_out(fd.type) != fd.type.spark():
            out.append(f"CAST({col} AS {_spark_out(fd.type).simpleString()}) AS {fd.name}")
        else:
            out.append(f"{col} AS {fd.name}")
    return out
