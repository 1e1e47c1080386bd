"""A detector's queries: asked, changed and dropped while its streams run (``StreamingDetector``'s query methods).

``QueryMethods`` is a mixin of ``StreamingDetector`` (``detector.py``), which holds what it reads: the bundle, the
``QueryBank``, the stream slots, the sinks and the lock that ``exclusive`` takes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Sequence

import numpy as np

from sdqes_edge.errors import UserError

from .alerts import AlertPolicy, AlertState, check_texts
from .bundle import Bundle
from .queries import TEXT_BATCH, Query, QueryBank, fused_capacity_words
from .sinks import Sink
from .stream_slot import StreamSlot


def exclusive(method):
    """``method`` run holding the detector's lock. A program may add or remove queries, reset, save or load the
    state from another thread (a voice command, a ROS callback) while a stream runs: a step then never sees half
    of such a change (the ids of one query set scored against the matrix of another: another query's score, or
    a KeyError). Reentrant: a sink, called inside a step, may add or remove queries itself. ``step``,
    ``add_query`` and ``add_queries`` take the lock inline instead: the warnings they raise point at their caller
    (stacklevel)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class QueryMethods:
    bundle: Bundle
    queries: QueryBank
    streams: list[StreamSlot]
    sinks: list[Sink]
    query_capacity: int | None  # a bundle exported with --fuse-queries scores at most this many; else None
    _lock: threading.RLock

    def thresholds(self) -> dict[str, float]:
        """Each query's alert threshold by id (what an annotated video marks on its score bars)."""
        return {q.id: q.policy.threshold for q in self.queries.queries.values()}

    def default_policy(self, threshold: float | None = None, exit_threshold: float | None = None,
                       cooldown_s: float | None = None, max_alerts: int | None = None,
                       label: str | None = None, **unknown) -> AlertPolicy:
        """The policy for a new query (``Bundle.policy_for``): what is given, else what the bundle recorded."""
        if unknown:  # add_query(..., cooldown=10) was a TypeError naming this method, which no caller called
            raise UserError(f"{', '.join(unknown)} is no option of a query's alert policy: give threshold, "
                            "exit_threshold, cooldown_s (seconds), max_alerts or label")
        return self.bundle.policy_for(label, threshold, exit_threshold, cooldown_s, max_alerts)

    def add_query(self, text: str, message: str | None = None, threshold: float | None = None,
                  query_id: str | None = None, label: str | None = None, **policy_options) -> Query:
        policy = self.default_policy(threshold, label=label, **policy_options)
        embedding = self.queries.encoder.encode(text)  # the text graph runs before the lock is taken: no step waits
        with self._lock:  # not a decorator: warnings raised below point at the caller (stacklevel)
            self._check_room_for(1)
            return self._add(text, embedding, policy, message, query_id, label)

    def add_queries(self, texts: Iterable[str], messages: Sequence[str | None] | None = None,
                    threshold: float | None = None, label: str | None = None, **policy_options) -> list[Query]:
        """Many queries under one alert policy, each added as ``add_query`` adds it (ids q1, q2, ... in order),
        their texts encoded ``TEXT_BATCH`` to a run of the text graph: a list of a thousand EgoSDQES queries took
        0.3 s on the demo bundle where ``add_query`` each took 0.55 s. ``messages``: one per text (None: the text
        itself). All or none: an empty or too long text, a message that is not text, or more queries than a
        fused bundle scores refuses the call before any query is added."""
        if isinstance(texts, str):  # a string is an iterable of one-letter queries
            raise UserError("add_queries takes a list of query texts, not one string; for one query call add_query")
        texts = list(texts)
        messages = [None] * len(texts) if messages is None else list(messages)
        if len(messages) != len(texts):
            raise UserError(f"add_queries was given {len(texts)} texts and {len(messages)} messages; give one "
                            "message per text (None where the text itself is the message), or none")
        for message in messages:
            check_texts(message=message)
        policy = self.default_policy(threshold, label=label, **policy_options)
        embeddings = self._encode_all(texts)  # before the lock, as in add_query
        with self._lock:
            self._check_room_for(len(texts))
            added = []
            for text, embedding, message in zip(texts, embeddings, messages):  # a loop: a comprehension's own frame
                added.append(self._add(text, embedding, policy, message, None, label))  # would shift stacklevel
            return added

    def _encode_all(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's embedding, ``TEXT_BATCH`` to a run; held here, not in the encoder's bounded cache, so that a
        list longer than the cache is encoded once."""
        encoder, embeddings = self.queries.encoder, []
        size = max(1, min(TEXT_BATCH, encoder.cache_size))  # each chunk kept whole until read back
        for start in range(0, len(texts), size):
            chunk = texts[start:start + size]
            encoder.encode_many(chunk)
            embeddings += [encoder.encode(text) for text in chunk]  # kept by encode_many; a refused text raises
        return embeddings

    def _check_room_for(self, count: int) -> None:
        active = len(self.queries.queries)
        if self.query_capacity is not None and active + count > self.query_capacity:
            asked, fix = ("", "remove one first") if count == 1 else (f", {count} more asked", "remove some first")
            raise UserError(f"this bundle {fused_capacity_words(self.query_capacity)}, and {active} are active{asked}: "
                            f"{fix}, or re-export the bundle without --fuse-queries to ask any number")

    def _add(self, text: str, embedding: np.ndarray, policy: AlertPolicy, message: str | None,
             query_id: str | None, label: str | None) -> Query:
        """One query in, the lock held: given an alert state on every stream and told to every sink."""
        query = self.queries.add(text, policy, message, query_id, self.streams[0].time, label, embedding,
                                 stacklevel=5)  # QueryBank._register, add, here, add_query(s): its caller
        for slot in self.streams:
            slot.alerts[query.id] = AlertState(policy)
            slot.restore_alert(query.id, text)  # a query asked again after a restart
        for sink in self.sinks:
            sink.on_query_added(query.id, query.text, query.added_at)
        return query

    @exclusive
    def remove_query(self, query: str | Query) -> None:
        """Stop asking a query, named by its id or by the ``Query`` that ``add_query`` returned."""
        query_id = self.queries.remove(query)
        for slot in self.streams:
            slot.forget(query_id)

    @exclusive
    def set_query_message(self, query: str | Query, message: str) -> None:
        """A new alert message for a query (its id or its ``Query``), its alert state kept: an event going on does
        not alert again."""
        self.queries.set_message(query, message)

    @exclusive
    def set_query_policy(self, query: str | Query, threshold: float | None = None, label: str | None = None,
                         **policy_options) -> Query:
        """A query (its id or its ``Query``) under another threshold or label (chosen as ``add_query`` chooses), its
        alert state kept (``AlertState.set_policy``): an event going on does not alert again."""
        query = self.queries.set_policy(query, self.default_policy(threshold, label=label, **policy_options), label)
        for slot in self.streams:
            slot.alerts[query.id].set_policy(query.policy)
        return query

    def add_bundle_queries(self, threshold: float | None = None, **policy_options) -> list[Query]:
        pre = self.bundle.queries()
        return [self.add_query(q["text"], q.get("response"), q.get("threshold", threshold), label=q.get("label"),
                               **policy_options) for q in (pre[0] if pre else [])]
