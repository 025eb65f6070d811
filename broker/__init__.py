"""The reference broker: a Kafka-wire-compatible broker (see main.py)."""

import os as _os

if "faketime" in _os.environ.get("LD_PRELOAD", ""):
    # Under libfaketime (the clock nemesis), clock_nanosleep fails with EINVAL while the wall
    # clock is offset, and Python's time.sleep uses it. select() sleeps on a relative timeout,
    # which libfaketime leaves alone. This runs before kazoo captures time.sleep.
    import select as _select
    import time as _time

    def _sleep(seconds: float) -> None:
        _select.select([], [], [], max(seconds, 0))

    _time.sleep = _sleep
