"""Telling a service manager how a run is doing: systemd's notification protocol (``sd_notify``), spoken by hand.

Under a unit of ``Type=notify`` systemd sets ``NOTIFY_SOCKET``; a run then says READY=1 once the model is loaded and
warmed and its sources are open (so ``systemctl start`` returns when alerts can come, and units ordered after it
start then, not when the process merely exists), keeps a one-line STATUS= for ``systemctl status``, pings
WATCHDOG=1 as frames are stepped (with ``WatchdogSec=``, a run that hangs, stepping nothing, is killed and
restarted), and says STOPPING=1 as it stops. Without ``NOTIFY_SOCKET`` (a terminal, docker, a plain unit) every
call does nothing. The protocol is one datagram per message on a Unix socket: no library needed, torch-free.
"""

from __future__ import annotations

import os
import socket
import time

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"  # where the manager listens: a path, or "@name" for an abstract socket
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"  # WatchdogSec, in microseconds: ping at least this often
WATCHDOG_PID_ENV = "WATCHDOG_PID"  # the process the watchdog is for (a child of ours must not answer for us)


class ServiceManager:
    """What a run tells its service manager. Each call is a no-op where no manager listens, and a manager that has
    gone (its socket refuses the message) is not the run's failure: it goes on, untold."""

    def __init__(self, environ: dict[str, str] | None = None):
        environ = os.environ if environ is None else environ
        address = environ.get(NOTIFY_SOCKET_ENV, "")
        # "@name": an abstract socket, whose name starts with a NUL byte
        self._address = "\0" + address[1:] if address.startswith("@") else address
        watchdog_pid = environ.get(WATCHDOG_PID_ENV)
        usec = environ.get(WATCHDOG_USEC_ENV, "")
        mine = watchdog_pid is None or watchdog_pid == str(os.getpid())
        self.watchdog_seconds = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and mine else None
        self._last_ping = -float("inf")
        self._socket: socket.socket | None = None

    @property
    def listening(self) -> bool:
        return bool(self._address)

    def ready(self, status: str) -> None:
        """The run streams now (model loaded and warmed, sources open)."""
        self._send(f"READY=1\nSTATUS={status}")
        self._last_ping = time.monotonic()

    def status(self, text: str) -> None:
        """The line ``systemctl status`` shows."""
        self._send(f"STATUS={text}")

    def alive(self) -> None:
        """A frame was stepped: ping the watchdog, at most twice per watchdog period (systemd's advice)."""
        if self.watchdog_seconds is None or time.monotonic() - self._last_ping < self.watchdog_seconds / 2:
            return
        self._last_ping = time.monotonic()
        self._send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")

    def _send(self, message: str) -> None:
        if not self._address:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)  # a manager slow to read must never stall the stream
                self._socket.connect(self._address)
            self._socket.send(message.encode("utf-8"))
        except BlockingIOError:  # its queue full (10 messages by default): this one dropped, a ping comes again
            pass
        except OSError:  # the manager has gone, or never was where it said: nothing to tell
            self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
