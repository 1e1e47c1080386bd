"""A state snapshot (``save_state``, ``run --save-state``; read by ``load_state``, ``run --resume``), as one .npz.

Beside the model's state it keeps, per stream, what a resumed run needs to go on as if it had never stopped:

    model_identity    str          the sha256 of the bundle's fp32 step graph (another model is refused)
    frame_counts      int [S]      frames stepped
    stream_times      float [S]    stream time of the last frame, seconds
    stream_sources    str [S]      the source each stream was reading (``FrameSource.identity``; "": none)
    stream_positions  int [S]      the sample index that source goes on at
    alert_texts       str [Q]      the queries whose alert states follow, by text (query ids are renumbered
                                   by each run; the same query asked again is the same text)
    alert_policies    str [Q]      and by alert policy (``policy_key``): one text asked under two policies (an
                                   early warning at 0.3, a confirmation at 0.8) has two alert states
    alert_active      bool [S, Q]  inside a run above threshold (hysteresis)
    alert_counts      int [S, Q]   alerts raised (max_alerts)
    alert_ages        float [S, Q] seconds from the last alert to the stream's last frame (cooldown); inf: none
    state/NAME        the state tensors, named as the bundle's state spec names them

Without the alert states a restarted camera service alerted again at once for an event still going on, and a
query limited to one alert raised a second. Snapshots written before these fields load as before: no source,
no alert states; those written before ``alert_policies`` restore each state by its text alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from sdqes_edge.errors import UserError
from sdqes_edge.files import NPZ_READ_ERRORS, npz_problem, replaced_atomically
from sdqes_edge.path_checks import as_path, path_problem

from .alerts import AlertPolicy, AlertState
from .ordered_calls import OrderedCalls
from .output_locks import STATE_SNAPSHOT, hold, release

STATE_PREFIX = "state/"
SNAPSHOT_SUFFIX = ".npz"


def snapshot_path(path: str | Path) -> Path:
    """The file a snapshot asked for at ``path`` lives in: ``.npz`` added where the name lacks it, as numpy's
    ``savez`` names its files. Saving and loading both go through it, so ``save_state("run1")`` is found by
    ``load_state("run1")`` (and by ``load_state("run1.npz")``)."""
    path = Path(path)
    return path if path.suffix == SNAPSHOT_SUFFIX else path.with_name(path.name + SNAPSHOT_SUFFIX)


def snapshot_to_read(path: str | Path) -> Path:
    """The file ``load_state(path)`` reads: ``path`` itself, else the ``.npz`` name ``save_state(path)`` gave it."""
    path = Path(path)
    return snapshot_path(path) if not path.exists() and snapshot_path(path).is_file() else path


def policy_key(policy: AlertPolicy) -> str:
    """An alert policy as text that compares equal exactly when the policies do (every field, unrounded)."""
    return json.dumps(dataclasses.astuple(policy))


@dataclass(frozen=True)
class SavedAlert:
    """One query's alert state on one stream, its last alert timed back from the stream's last frame."""

    active: bool
    count: int
    age_s: float  # inf: no alert yet

    @classmethod
    def of(cls, state: AlertState, stream_time: float) -> SavedAlert:
        return cls(state.active, state.alerts, stream_time - state.last_alert_time)

    def apply(self, state: AlertState, stream_time: float) -> None:
        """Restore into ``state``, the last alert placed ``age_s`` before ``stream_time``."""
        state.active, state.alerts, state.last_alert_time = self.active, self.count, stream_time - self.age_s


@dataclass
class StreamRecord:
    """What a snapshot keeps of one stream besides its rows of the state."""

    frames: int = 0
    time: float = 0.0
    source: str = ""
    position: int = 0
    alerts: dict[tuple[str, str], SavedAlert] = field(default_factory=dict)  # (text, policy_key) -> its state

    def saved_alert(self, text: str, policy: AlertPolicy) -> SavedAlert | None:
        """The state saved for this text under this policy; else the text's only saved state (its policy retuned
        between runs, or a snapshot from before policies were kept); else none (several, none of this policy)."""
        exact = self.alerts.get((text, policy_key(policy)))
        if exact is not None:
            return exact
        same_text = self._by_text.get(text, [])
        return same_text[0] if len(same_text) == 1 else None

    @cached_property
    def _by_text(self) -> dict[str, list[SavedAlert]]:  # a dict, not a scan: bundles hold 10,000 queries
        by_text: dict[str, list[SavedAlert]] = {}
        for (text, _), saved in self.alerts.items():
            by_text.setdefault(text, []).append(saved)
        return by_text


class UnusableSnapshot(UserError):
    """A state snapshot that cannot be resumed from here: another model's, another batch size's, or damaged.
    ``problem`` says what is wrong in words that follow its path, without the advice: ``run --state`` sets such a
    snapshot aside and starts afresh, so that a service whose bundle was re-exported comes back up."""

    def __init__(self, path: Path | str, problem: str, advice: str):
        super().__init__(f"{path} {problem}; {advice}")
        self.problem = problem


@dataclass
class Snapshot:
    model_identity: str | None  # None: written before snapshots named their model
    state: dict[str, np.ndarray]
    streams: list[StreamRecord]

    def check_fits(self, path: Path | str, model_identity: str, spec, bundle_root: Path) -> None:
        """Refuse the snapshot read from ``path`` unless its state is this model's, of these shapes (``spec``: the
        backend's state spec). Another model of the same shapes would take it silently; snapshots from before
        snapshots named their model name none."""
        if self.model_identity is not None and self.model_identity != model_identity:
            raise UnusableSnapshot(path, f"was saved by another model (its bundle's step graph differs from "
                                         f"{bundle_root}'s)", "resume only from a snapshot of this bundle, or "
                                                              "start afresh without --resume")
        for tensor in spec:
            if tensor.name not in self.state or tuple(self.state[tensor.name].shape) != tuple(tensor.shape):
                raise UnusableSnapshot(path, f"does not fit this bundle's state ({tensor.name} "
                                             f"{list(tensor.shape)})", "it was saved from another model or batch "
                                                                        "size")


def write_snapshot(path: Path, snapshot: Snapshot) -> Path:
    """Atomically: a run stopped by a second signal mid-write keeps the snapshot it had."""
    keys = sorted({key for record in snapshot.streams for key in record.alerts})
    alerts = [[record.alerts.get(key) for key in keys] for record in snapshot.streams]
    arrays = {f"{STATE_PREFIX}{k}": v for k, v in snapshot.state.items()}
    with replaced_atomically(path) as partial, open(partial, "wb") as fh:  # a handle: numpy adds no suffix
        np.savez(fh, model_identity=np.asarray(snapshot.model_identity),
                 frame_counts=np.array([r.frames for r in snapshot.streams], np.int64),
                 stream_times=np.array([r.time for r in snapshot.streams], np.float64),
                 stream_sources=np.array([r.source for r in snapshot.streams], dtype=str),
                 stream_positions=np.array([r.position for r in snapshot.streams], np.int64),
                 alert_texts=np.array([text for text, _ in keys], dtype=str).reshape(len(keys)),
                 alert_policies=np.array([policy for _, policy in keys], dtype=str).reshape(len(keys)),
                 alert_active=np.array([[bool(a and a.active) for a in row] for row in alerts], bool),
                 alert_counts=np.array([[a.count if a else 0 for a in row] for row in alerts], np.int64),
                 alert_ages=np.array([[a.age_s if a else math.inf for a in row] for row in alerts], np.float64),
                 **arrays)
    return path


OnDone = Callable[[Optional[OSError]], None]  # told how a write ended: None once written, or the machine's refusal


def check_on_done(on_done: object) -> None:
    """Refuse an ``on_done`` that cannot be called, before the write it is for."""
    if on_done is not None and not callable(on_done):  # else the refusal it was for raised a TypeError instead
        raise UserError(f"save_state's on_done is called with None once the snapshot is written, or with the "
                        f"OSError that refused it; give a function, not a {type(on_done).__name__}")


def write_telling(path: Path, snapshot: Snapshot, on_done: OnDone | None) -> None:
    """``write_snapshot``; where ``on_done`` is given, it is told how the write ended: None once written, or the
    OSError the machine refused it with (a full disk, a quota), which is then not raised."""
    try:
        write_snapshot(path, snapshot)
    except OSError as refusal:
        if on_done is None:
            raise
        on_done(refusal)
    else:
        if on_done is not None:
            on_done(None)


class SnapshotWriter:
    """Writes snapshots on a thread of its own, one at a time, in the order given: a run's snapshot after an alert
    (``run --state``) held the thread that steps for as long as the write took, 15 ms for one ViT-B/16 stream's
    9 MiB here, 0.3-0.8 s for 32 streams' 268 MiB (an SD card or eMMC takes longer), while its cameras dropped
    frames. What a write raised is raised by the next ``write`` or by ``wait``."""

    def __init__(self) -> None:
        self._in_flight: OrderedCalls | None = None

    def write(self, path: Path, snapshot: Snapshot, wait: bool, on_done: OnDone | None = None) -> Path:
        """Write ``snapshot`` (host copies, not to be changed after) at ``path`` after the one in flight: on this
        thread (``wait``) or on one of its own, ``on_done`` (``write_telling``) called on the writing thread, so that
        a service says a refusal as it happens and streams on, not at its next snapshot, minutes later. The file's
        lock is held until it is written (runtime/output_locks.py): another process's snapshot (a service's --state),
        or a file this program writes as something else (an alert log), is refused."""
        check_on_done(on_done)
        if not isinstance(wait, bool):  # "no" was taken as yes: the stream waited on the disk it was told not to
            raise UserError(f"save_state's wait is True or False, not {wait!r}")
        lock = hold(path, "save_state", STATE_SNAPSHOT)

        def written() -> None:
            try:
                write_telling(path, snapshot, on_done)
            finally:
                release(lock)

        try:
            self.wait()
        except BaseException:
            release(lock)
            raise
        if wait:
            written()
            return path
        # Not a daemon: a snapshot begun is finished before the process exits (the write is atomic anyway); its
        # thread ends once it is written.
        self._in_flight = OrderedCalls("state-snapshot", 1, daemon=False)
        self._in_flight.call(written)
        self._in_flight.close()
        return path

    def wait(self) -> None:
        """The write in flight finished; what it raised, raised here."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.join()


def read_snapshot(path: str | Path) -> Snapshot:
    path = snapshot_to_read(as_path(path, "load_state takes"))  # named as it was asked for, not as written
    problem = path_problem(path, "file")
    if problem:
        raise UserError(f"state snapshot {path} {problem}; give the file save_state (run --save-state) wrote")
    try:
        with np.load(path, allow_pickle=False) as data:
            state = {k[len(STATE_PREFIX):]: data[k] for k in data.files if k.startswith(STATE_PREFIX)}
            if "frame_counts" not in data.files:  # an archive of other arrays, not a damaged snapshot
                raise UserError(f"{path} is a NumPy archive but not a state snapshot written by save_state (a score "
                                "trace from --scores, or another program's arrays?); give the file save_state "
                                "(run --save-state) wrote")
            counts = data["frame_counts"].tolist()
            identity = str(data["model_identity"]) if "model_identity" in data.files else None
            streams = [StreamRecord(int(c)) for c in counts]
            if "stream_sources" in data.files:
                _read_streams(data, streams)
    except NPZ_READ_ERRORS as exc:
        raise UnusableSnapshot(path, f"is not a state snapshot written by save_state ({npz_problem(exc)})",
                               "give the file save_state (run --save-state) wrote") from None
    return Snapshot(identity, state, streams)


def _read_streams(data, streams: list[StreamRecord]) -> None:
    texts = [str(t) for t in data["alert_texts"]]
    policies = [str(p) for p in data["alert_policies"]] if "alert_policies" in data.files else [""] * len(texts)
    keys = list(zip(texts, policies))
    for s, record in enumerate(streams):
        record.time = float(data["stream_times"][s])
        record.source = str(data["stream_sources"][s])
        record.position = int(data["stream_positions"][s])
        record.alerts = {key: SavedAlert(bool(data["alert_active"][s, q]), int(data["alert_counts"][s, q]),
                                         float(data["alert_ages"][s, q])) for q, key in enumerate(keys)}
