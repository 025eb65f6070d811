"""wait_until returns the predicate's value, or fails with the message and the last error."""

from __future__ import annotations

import itertools

import pytest

from faultline.control import wait_until


def test_returns_the_first_truthy_value():
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "done", 5, "never") == "done"


def test_exceptions_count_as_not_yet():
    calls = itertools.count()

    def flaky():
        if next(calls) < 2:
            raise ConnectionRefusedError("not yet")
        return 42

    assert wait_until(flaky, 5, "never") == 42


def test_timeout_names_the_message_and_the_last_error():
    def refuses():
        raise ConnectionRefusedError("port 9092 closed")

    with pytest.raises(TimeoutError) as info:
        wait_until(refuses, 0.2, "broker n1 never accepted", interval=0.01)
    text = str(info.value)
    assert "broker n1 never accepted" in text and "port 9092 closed" in text
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_timeout_reports_the_last_falsy_value():
    with pytest.raises(TimeoutError, match=r"still 0.*last value \[\]"):
        wait_until(lambda: [], 0, "still 0")


def test_a_message_given_as_a_callable_is_made_when_the_wait_fails_from_what_was_found():
    found = []

    def predicate():
        found.append(len(found))
        return False

    with pytest.raises(TimeoutError) as info:
        wait_until(predicate, 0.2, lambda: f"no leader; states seen {len(found)}", interval=0.05)
    assert str(info.value).startswith(f"no leader; states seen {len(found)} (waited 0.2s, {len(found)} attempt(s)")


def test_a_message_that_cannot_be_made_still_leaves_the_timeout_with_why():
    def message():
        raise ConnectionError("ZooKeeper is gone")

    with pytest.raises(TimeoutError) as info:
        wait_until(lambda: False, 0, message)
    assert str(info.value) == ("(the wait's message could not be made: ConnectionError: ZooKeeper is gone) "
                               "(waited 0s, 1 attempt(s); last value False)")
