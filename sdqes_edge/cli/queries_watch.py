"""``run --watch-queries``: the --queries-file read again while the stream runs, whenever it changes.

A service asks its queries from a file (``/etc/sdqes-edge/queries.csv``); without this, a new query meant a
restart: the model loaded and warmed again and the camera reopened, seconds without alerts. Here a thread looks at
the file every ``QUERIES_POLL_SECONDS`` (a few KB) and, once a change has held for one look (an editor or a script
may be half way through writing it), applies the difference: new lines are added, lines gone are removed, a line
whose alert message, threshold or label changed keeps its query under the new message or policy, and its alert
state: an event going on does not alert again, and its alerts so far still count. The queries of --query
are never touched. A file that cannot be read, or holds no queries, changes nothing: the queries streaming are
kept, with a warning.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sdqes_edge.cli.common import say, text_key, unique_queries, warn
from sdqes_edge.cli.queries_file import QueryLine, read_queries_file
from sdqes_edge.errors import UserError
from sdqes_edge.progress import with_progress
from sdqes_edge.runtime.queries import TEXT_BATCH

if TYPE_CHECKING:
    from sdqes_edge.runtime.detector import StreamingDetector
    from sdqes_edge.runtime.queries import Query

QUERIES_POLL_SECONDS = 1.0  # how often the file is looked at: a change is applied one to two looks later
SHOWN_TEXTS = 3  # queries named in a change's line; more are counted
CHANGES = ("added", "removed", "a new threshold for", "a new label for", "a new message for")  # as the line says them


def file_signature(path: str) -> bytes | None:
    """What tells one version of the file from the next: its content's digest (a rewrite of the same size within
    one tick of the file system's clock is a change too, a save that changes nothing is none); None while there is
    no file there to read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).digest()
    except OSError:
        return None


class Asked(NamedTuple):
    """A line of the file and the query it asked."""

    line: QueryLine
    query: Query


class QueriesFileWatcher:
    """Keeps the detector's queries from ``path`` equal to the file's lines. ``watched``: the file's queries as the
    run started (key -> Asked, keyed as ``unique_queries`` tells queries apart); ``fixed``: the keys of the command
    line's queries, which a line of the file does not ask again; ``ask``: how the run asks a line (``LineAsker``);
    ``started_with``: the ``file_signature`` taken before the run read the file (the model
    loads for seconds after that: a change meanwhile is applied at the first looks). ``check`` looks once (the
    thread calls it; a test may call it itself)."""

    def __init__(self, detector: StreamingDetector, path: str, watched: dict[str, Asked], fixed: set[str],
                 ask: LineAsker, started_with: bytes | None,
                 poll_seconds: float = QUERIES_POLL_SECONDS):
        self.detector, self.path, self.watched, self.fixed, self.ask = detector, path, watched, fixed, ask
        self.poll_seconds = poll_seconds
        self._applied = self._seen = started_with
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> QueriesFileWatcher:
        self._thread = threading.Thread(target=self._watch, name="sdqes-queries-file", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """No change applied after this returns (one being applied is finished first): before the detector closes."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.check()

    def check(self) -> None:
        signature = file_signature(self.path)
        if signature == self._applied:
            return
        if signature != self._seen:  # changed since the last look: wait until it holds still for one
            self._seen = signature
            return
        self._applied = signature
        if signature is None:
            warn(f"--queries-file {self.path} is gone (or cannot be read); {self.streaming()} kept, and the file is "
                 "read again when it is back")
            return
        try:
            wanted = {key: line for key, line in keyed(read_queries_file(self.path)).items() if key not in self.fixed}
        except UserError as exc:
            warn(f"--queries-file changed, but {exc}; {self.streaming()} kept")
            return
        self.apply(wanted)

    def apply(self, wanted: dict[str, QueryLine]) -> None:
        """Make the watched queries those of ``wanted`` (key -> line of the file), and say what changed."""
        # What changed, in the order the line says it: the queries of each change.
        said: dict[str, list[Query]] = {change: [] for change in CHANGES}
        said["removed"] = [self.watched.pop(key).query for key in list(self.watched) if key not in wanted]
        for query in said["removed"]:
            self.detector.remove_query(query.id)
        for key, asked in self.watched.items():
            self.watched[key] = self._kept(asked, wanted[key], said)
        added = {key: line for key, line in wanted.items() if key not in self.watched}
        self.detector.queries.encoder.encode_many([line.text for line in added.values()])  # TEXT_BATCH to a run
        for key, line in added.items():
            try:
                self.watched[key] = Asked(line, self.ask(line))
            except UserError as exc:  # too long for the bundle's tokenizer, a fused bundle full, ...
                warn(f"--queries-file's query {line.text!r} is not asked: {exc}")
                continue
            said["added"].append(self.watched[key].query)
        changes = [f"{change} {quoted(queries)}" for change, queries in said.items() if queries]
        if changes:
            say(f"--queries-file {self.path} changed: {'; '.join(changes)}; {self.streaming()}")

    def _kept(self, asked: Asked, line: QueryLine, said: dict[str, list[Query]]) -> Asked:
        """A query the file still asks, under its line as it is now: each change it took listed in ``said``."""
        query = asked.query
        # Another threshold, or another label (which may pick another threshold): the query under its new policy,
        # its alert state kept.
        if (asked.line.threshold, asked.line.label) != (line.threshold, line.label):
            try:
                self.ask.change_policy(query, line)
            except UserError as exc:  # --exit-threshold above the new threshold, ...
                warn(f"--queries-file's query {line.text!r} keeps its threshold {query.policy.threshold:g}: {exc}")
                line = line._replace(threshold=asked.line.threshold, label=asked.line.label)  # tried again next time
            else:
                change = "a new threshold for" if asked.line.threshold != line.threshold else "a new label for"
                said[change].append(query)
        if query.message != line.message:
            self.detector.set_query_message(query.id, line.message)
            said["a new message for"].append(query)
        return Asked(line, query)

    def streaming(self) -> str:
        count = len(self.detector.queries.ids)
        return f"{count} quer{'y' if count == 1 else 'ies'} streaming"


class LineAsker:
    """How a run asks a line of its queries: at the line's own threshold, else ``threshold`` (--threshold), else the
    bundle's for the line's label, else the bundle's default; under the run's other policy options."""

    def __init__(self, detector: StreamingDetector, threshold: float | None = None, **policy_options):
        self.detector, self.threshold, self.policy_options = detector, threshold, policy_options

    def __call__(self, line: QueryLine) -> Query:
        """The line's query added."""
        return self.detector.add_query(line.text, line.message, self._threshold(line), label=line.label,
                                       **self.policy_options)

    def ask_all(self, lines: list[QueryLine], show_progress: bool = True) -> list[Query]:
        """Each line's query added, their texts encoded ``TEXT_BATCH`` to a run of the text graph first, with a
        progress bar where there are many: a queries file of thousands had run the text graph once a query, minutes
        of a ViT-B/16 text tower on a CPU without a word."""
        added: list[Query] = []
        for index, line in enumerate(with_progress(lines, "encoding queries", "query",
                                                   enabled=show_progress and len(lines) > TEXT_BATCH)):
            if index % TEXT_BATCH == 0:  # the next batch's texts, in one run
                self.detector.queries.encoder.encode_many([later.text for later in lines[index:index + TEXT_BATCH]])
            added.append(self(line))
        return added

    def change_policy(self, query: Query, line: QueryLine) -> Query:
        """``query``, asked by an earlier version of ``line``, under the line's threshold and label now."""
        return self.detector.set_query_policy(query.id, self._threshold(line), label=line.label, **self.policy_options)

    def _threshold(self, line: QueryLine) -> float | None:
        return line.threshold if line.threshold is not None else self.threshold


def keyed(lines: list[QueryLine]) -> dict[str, QueryLine]:
    """Queries by ``text_key``, a query given twice once (with ``unique_queries``'s warning)."""
    return {text_key(line.text): line for line in unique_queries(lines)}


def quoted(queries: list[Query]) -> str:
    shown = ", ".join(repr(q.text) for q in queries[:SHOWN_TEXTS])
    return shown + (f" and {len(queries) - SHOWN_TEXTS} more" if len(queries) > SHOWN_TEXTS else "")
