"""A live source: a camera index or a stream URL (RTSP/HTTP, a GStreamer pipeline), read with OpenCV."""

from __future__ import annotations

import time

import cv2

from sdqes_edge.errors import UserError

from .frame_source import FrameSource

RECONNECT_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # back-off between attempts; then the source gives up


class LiveSource(FrameSource):
    """A camera index or a stream URL: stamped by the wall clock, reopened with back-off when it drops."""

    live = True

    def __init__(self, target: int | str, fps: float, reconnect_delays: tuple[float, ...] = RECONNECT_DELAYS_S):
        super().__init__(f"camera{target}" if isinstance(target, int) else str(target), fps)
        self.target = target
        self.reconnect_delays = reconnect_delays
        capture = self._open()
        if capture is None:
            what = f"camera index {target}" if isinstance(target, int) else f"stream {target}"
            raise UserError(f"OpenCV cannot open {what}; check it is connected (ls /dev/video*) or the URL plays "
                            "(e.g. in ffplay), and that no other program holds it")
        self._capture = capture

    def _open(self):
        capture = cv2.VideoCapture(self.target)
        if capture.isOpened():
            return capture
        capture.release()
        return None

    @property
    def duration_frames(self) -> None:
        return None

    def _frames(self):
        capture, start = self._capture, time.monotonic()
        try:
            while True:
                ok, image = capture.read() if capture is not None else (False, None)
                if ok:
                    yield (lambda image=image: image), time.monotonic() - start
                    continue
                if capture is not None:
                    capture.release()
                capture = None
                for attempt, delay in enumerate(self.reconnect_delays, 1):
                    self.log(f"{self.name}: no frame; reconnecting in {delay:g} s (attempt {attempt} of "
                             f"{len(self.reconnect_delays)})")
                    time.sleep(delay)
                    capture = self._open()
                    if capture is not None:
                        self.stats.reconnects += 1
                        self.log(f"{self.name}: reconnected")
                        break
                if capture is None:
                    self.log(f"{self.name}: gave up after {len(self.reconnect_delays)} attempts")
                    return
        finally:
            if capture is not None:
                capture.release()
