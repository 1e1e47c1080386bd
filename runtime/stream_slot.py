"""One stream's place in a detector's batch: everything the detector keeps for it but its rows of the state."""

from __future__ import annotations

from dataclasses import dataclass, field

from .alerts import AlertState
from .frame_source import FrameSource
from .pacing import StreamPace
from .snapshots import StreamRecord


@dataclass
class StreamSlot:
    """One stream's place in the batch, and everything the detector keeps for it but its rows of the state."""
    index: int  # the row (axis 0) of the batched state this stream occupies
    name: str
    frames: int = 0  # frames stepped (counted on from a restored snapshot)
    time: float = 0.0  # stream time of its last frame, seconds
    alerts: dict[str, AlertState] = field(default_factory=dict)  # query id -> this stream's alert state
    source: str = ""  # the identity of the source it reads (FrameSource.identity)
    position: int = 0  # the sample index of that source after its last frame
    resumed: StreamRecord | None = None  # from a snapshot, until ``attach`` decides where its source goes on
    attached: FrameSource | None = field(default=None, repr=False)  # the source ``attach`` gave this stream
    pace: StreamPace | None = None  # its frame times against the model's rate (None: a model without state)

    def restore_alert(self, query_id: str, text: str) -> None:
        """A query's alert state as the snapshot this stream was restored from left it (``saved_alert``)."""
        saved = self.resumed.saved_alert(text, self.alerts[query_id].policy) if self.resumed else None
        if saved is not None:
            saved.apply(self.alerts[query_id], self.time)

    def reset(self) -> None:
        """What a new scene forgets: the alert states, and the frame times its pace is measured over."""
        for state in self.alerts.values():
            state.reset()
        if self.pace is not None:
            self.pace.restart()
