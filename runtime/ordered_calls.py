"""Calls made on a thread of their own, one after another in the order given, so that slow writes (an annotated
video's encoding, a state snapshot) do not hold the thread that steps; what a call raised is raised in the
caller's thread."""

from __future__ import annotations

import queue
import threading
from typing import Callable


class OrderedCalls:
    """A thread that makes the calls handed to it (``call``) in order, at most ``waiting`` of them waiting (past
    them ``call`` waits for room), until ``close``. A call that raised is raised by the next ``call`` or by
    ``join``, and the calls after it are skipped."""

    def __init__(self, name: str, waiting: int, daemon: bool):
        self._calls: queue.Queue = queue.Queue(maxsize=waiting)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._make_calls, name=name, daemon=daemon)
        self._thread.start()

    def _make_calls(self) -> None:
        while (call := self._calls.get()) is not None:
            if self._failure is None:
                try:
                    call()
                except BaseException as error:  # noqa: BLE001 (handed to the caller's thread, which raises it)
                    self._failure = error

    def call(self, function: Callable[[], object]) -> None:
        """``function()`` made after the calls before it (what it uses not to be changed after)."""
        self._raise_failure()
        self._calls.put(function)

    def close(self) -> None:
        """No more calls: the thread ends once those handed over are made."""
        self._calls.put(None)

    def join(self) -> None:
        """Wait until the thread has ended (``close``); what a call raised, raised here."""
        self._thread.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
