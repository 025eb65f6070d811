"""Polling with a deadline, instead of bare sleeps.

In: a predicate (any callable), a timeout in seconds, and the message to fail
with (or a callable that makes it when the wait fails, to say what was found).
Out: the predicate's first truthy value, or `TimeoutError` whose text is the
message plus how long was waited, the last value returned and the last
exception raised, so a failure says what it was waiting for and why it never
came.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar, Union

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, message: Union[str, Callable[[], str]],
               interval: float = 0.05) -> T:
    """Call `predicate` every `interval` seconds until it returns a truthy value.

    Exceptions from the predicate count as "not yet": a system that is coming
    up often refuses connections or lacks a file for a while.
    """
    deadline = time.monotonic() + timeout
    last_value: object = None
    last_exc: BaseException | None = None
    attempts = 0
    while True:
        attempts += 1
        try:
            value = predicate()
            if value:
                return value
            last_value, last_exc = value, None
        except Exception as exc:  # noqa: BLE001 - reported in the TimeoutError
            last_exc = exc
        # Checked after the call, so even timeout=0 tries once.
        if time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    details = f"waited {timeout:g}s, {attempts} attempt(s); last value {last_value!r}"
    if last_exc is not None:
        details += f"; last error: {type(last_exc).__name__}: {last_exc}"
    if callable(message):
        try:
            message = message()
        except Exception as exc:  # noqa: BLE001 - the timeout is what the caller must see
            message = f"(the wait's message could not be made: {type(exc).__name__}: {exc})"
    error = TimeoutError(f"{message} ({details})")
    raise error from last_exc
