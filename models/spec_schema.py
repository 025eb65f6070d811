"""The schema of a stored `test.json` (the run's spec), for a checker that reads one it did not write.

In: the path of a test.json. Out: its object, with every field the spec knows checked against its
type, or a `SpecFileError` (a ValueError) of one paragraph naming test.json, the field, what was
expected, what was found and how to fix it.

The fields and their types come from `TestSpec` itself (its annotations), so a field added to the
spec is checked here too; `consumer_mode` (how the run's consumers read) is the checker's own.
Fields the spec does not know are ignored: a harness may record more.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

from .history_schema import found
from .spec import TestSpec

MAX_DEPTH = 100


class SpecFileError(ValueError):
    """A test.json that cannot be used; the message names the file and the field."""

    def __init__(self, path: Path, message: str, field: str | None = None):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.field = field


def _int(v):
    return type(v) is int


def _number(v):
    return type(v) in (int, float) and math.isfinite(v)


def _string(v):
    return type(v) is str


def _setting(v):
    return type(v) in (str, int, bool) or (type(v) is float and math.isfinite(v))


# Annotation (as written in TestSpec) -> (test, what is expected).
TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (_string, "a string"),
    "int": (_int, "an integer"),
    "float": (_number, "a number"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "list[str]": (lambda v: type(v) is list and all(map(_string, v)), "a list of strings"),
    "dict[str, str]": (lambda v: type(v) is dict and all(map(_setting, v.values())),
                       "an object of setting name -> value (a string, number or boolean)"),
    "dict[str, int]": (lambda v: type(v) is dict and all(map(_int, v.values())), "an object of name -> integer"),
}


def _rule(annotation: str) -> tuple[Callable[[Any], bool], str] | None:
    optional = annotation.endswith(" | None")
    base = TYPES.get(annotation.removesuffix(" | None"))
    if base is None:
        return None
    if optional:
        test, expect = base
        return (lambda v: v is None or test(v)), f"{expect} or null"
    return base


FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    f.name: rule for f in dataclasses.fields(TestSpec) if (rule := _rule(str(f.type))) is not None
}
FIELDS["consumer_mode"] = (lambda v: v in (None, "assign", "subscribe"), '"assign", "subscribe" or null')


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """test.json's object, checked; SpecFileError otherwise (see the module docstring)."""
    path = Path(path)
    fix_file = "correct it, or remove test.json to judge the history by the strictest model (or give --model)"
    if path.is_dir():
        raise SpecFileError(path, f"is a directory, not a file: test.json holds the run's settings as one JSON "
                                  f"object; {fix_file}")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecFileError(path, f"not UTF-8 (byte {exc.start + 1}); {fix_file}") from None
    except OSError as exc:
        raise SpecFileError(path, f"cannot read the file ({exc.strerror or exc}); check that this user may read "
                                  f"it, or {fix_file}") from None
    try:
        spec = json.loads(text, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise SpecFileError(path, f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} of "
                                  f"test.json; {fix_file}") from None
    except RecursionError:
        raise SpecFileError(path, f"not valid JSON: nested deeper than Python reads; {fix_file}") from None
    except ValueError as exc:
        raise SpecFileError(path, f"not valid JSON: {exc}; {fix_file}") from None
    if type(spec) is not dict:
        raise SpecFileError(path, f"expected one JSON object (the run's settings), found {found(spec)}; {fix_file}")
    for name, (test, expect) in FIELDS.items():
        if name in spec and not test(spec[name]):
            raise SpecFileError(path, f"field {name}: expected {expect}, found {found(spec[name])}; correct the "
                                      f"field in test.json, or remove it", field=name)
    return spec
