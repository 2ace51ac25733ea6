"""Waiting with a deadline in tests (torch.futures.Future.wait() has none):
a regression that never completes a future fails the test instead of
hanging CI."""

import time


def wait_future(fut, timeout=60.0):
    """fut.wait(), but raises AssertionError if `fut` is not done within
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not fut.done():
        if time.monotonic() > deadline:
            raise AssertionError("future not completed within %.0f s" % timeout)
        time.sleep(0.001)
    return fut.wait()


def wait_until(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("%s not reached within %.0f s" % (what, timeout))
        time.sleep(0.005)
