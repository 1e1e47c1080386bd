"""The active queries of a stream: encoded once with the bundle's text graph, scored in one product.

Texts are tokenized with the bundle's own CLIP vocabulary and encoded by its
text-encoder graph under ONNX Runtime (no torch); the embeddings of recently asked texts are kept
(``TEXT_CACHE_SIZE``), so re-adding a query costs nothing. Queries can be added and removed between frames.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import reprlib
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdqes_edge.contract import TOKEN_INPUT
from sdqes_edge.errors import UserError
from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.tokenizer import ClipTokenizer, check_query_text
from sdqes_edge.traces import query_key

from .alerts import AlertPolicy, below_every_score_words, check_texts, never_reached_words
from .bundle import Bundle, as_bundle
from .ort_sessions import load_refusal, session_options

# Texts encoded at run time whose embeddings are kept for a query asked again (the least recently asked go first):
# a program that runs for months, asking new texts all along, keeps a bounded memory. The bundle's pre-encoded
# queries and the active ones (``QueryBank`` holds their rows) are never encoded again, whatever this bound.
TEXT_CACHE_SIZE = 4096
# Texts the text graph encodes in one run where many are asked at once (``TextEncoder.encode_many``): a queries file
# of thousands ran it once a query, 2.7x as long on the demo's text tower.
TEXT_BATCH = 64


class DuplicateQueryWarning(UserWarning):
    """A query added while the same one (as CLIP reads it, under the same alert policy) is active: every event
    would alert twice."""


class ThresholdOutOfReachWarning(UserWarning):
    """A query given a threshold outside the scores p = sigmoid(cos) can take (``SCORE_RANGE``): it would never
    alert, or alert at its first frame alone."""


@dataclass
class Query:
    id: str
    text: str
    message: str  # the alert shown to the user
    policy: AlertPolicy
    added_at: float  # stream time when it was added
    label: str | None = None  # what kind of event it asks for, where a threshold may be chosen per label


def score(embeddings: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings [..., E] against queries [Q, E] (both L2-normalized) -> (cosines, p = sigmoid(cos)), [..., Q].

    DESIGN.md section 1: no temperature; the threshold applies to p.
    """
    cosines = embeddings @ queries.T
    return cosines, probabilities(cosines)


def fused_capacity_words(capacity: int) -> str:
    """What a step graph exported with --fuse-queries allows, for the refusals of one query too many."""
    return f"scores at most {capacity} queries at once, inside its step graph (exported with --fuse-queries)"


def probabilities(cosines: np.ndarray) -> np.ndarray:
    """p = sigmoid(cos), what alert thresholds apply to."""
    return 1.0 / (1.0 + np.exp(-cosines))


class TextEncoder:
    """Query text -> L2-normalized embedding [E], with the bundle's tokenizer and text graph."""

    def __init__(self, text_graph: Path, vocab: Path, context_length: int, on_overflow: str = "error",
                 threads: int | None = None, cache_size: int = TEXT_CACHE_SIZE):
        self.text_graph, self.vocab, self.context_length = text_graph, vocab, context_length
        self.on_overflow = on_overflow
        self.threads = threads  # ONNX Runtime intra-op threads (None: all cores)
        self.cache_size = cache_size
        self._seeded: dict[str, np.ndarray] = {}  # the bundle's pre-encoded queries, kept
        self._cache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()  # least recent first
        self._cache_lock = threading.Lock()

    # Loaded on the first query that is not pre-encoded: a ViT-B/16 text graph is 240 MB.
    @functools.cached_property
    def tokenizer(self) -> ClipTokenizer:
        return ClipTokenizer(str(self.vocab), context_length=self.context_length)

    @functools.cached_property
    def session(self):
        ort = load_onnxruntime()
        try:
            return ort.InferenceSession(str(self.text_graph), session_options(self.threads),
                                        providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/NotImplemented types
            raise load_refusal(exc, Path(self.text_graph), "a text encoder") from None

    def seed(self, texts: list[str], embeddings: np.ndarray) -> None:
        """Pre-encoded queries from the bundle."""
        for text, emb in zip(texts, embeddings):
            self._seeded[text] = np.asarray(emb, np.float32)

    def encode(self, text: str) -> np.ndarray:
        check_query_text(text)
        if text in self._seeded:
            return self._seeded[text]
        with self._cache_lock:  # a detector's queries are added from any thread, outside its step lock
            if (hit := self._cache.get(text)) is not None:
                self._cache.move_to_end(text)
                return hit
        ids = self.tokenizer.tokenize([text], on_overflow=self.on_overflow)
        embedding = self.session.run(None, {TOKEN_INPUT: ids})[0][0]
        self._keep([text], [embedding])
        return embedding

    def encode_many(self, texts: list[str]) -> None:
        """Encode ``texts`` ahead of the ``encode`` calls that will ask for them, ``TEXT_BATCH`` to a run of the text
        graph, each embedding what ``encode`` gives alone (the batch's rows are computed apart); those already
        pre-encoded or kept are left, and no more are encoded than the cache keeps. A text the tokenizer refuses
        (too long) is left for ``encode`` to refuse in its own words when it is asked."""
        with self._cache_lock:
            todo = [t for t in dict.fromkeys(texts) if t not in self._seeded and t not in self._cache]
        todo = todo[:self.cache_size]
        for start in range(0, len(todo), TEXT_BATCH):
            batch, ids = [], []
            for text in todo[start:start + TEXT_BATCH]:
                try:
                    ids.append(self.tokenizer.tokenize([text], on_overflow=self.on_overflow)[0])
                except UserError:
                    continue
                batch.append(text)
            if batch:
                self._keep(batch, self.session.run(None, {TOKEN_INPUT: np.stack(ids)})[0])

    def _keep(self, texts: list[str], embeddings) -> None:
        with self._cache_lock:
            for text, embedding in zip(texts, embeddings):
                self._cache[text] = embedding
                self._cache.move_to_end(text)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)


class QueryBank:
    """Queries with their embeddings [Q, E] (rebuilt only when the set changes); each stream keeps its own alert
    state per query (``stream_slot.StreamSlot``)."""

    def __init__(self, encoder: TextEncoder):
        self.encoder = encoder
        self.queries: dict[str, Query] = {}
        self._rows: dict[str, np.ndarray] = {}  # each active query's embedding, by id (the encoder's cache is bounded)
        self._matrix: np.ndarray | None = None
        self._levels: np.ndarray | None = None  # each query's threshold, in ``ids`` order (``over``)
        self._positions: dict[str, int] | None = None  # each id's place in ``ids``
        self._graph_input: tuple[np.ndarray, np.ndarray] | None = None  # (``matrix``, it as a graph's input)
        self.changes = 0  # queries added or removed so far: whether the set changed since a given moment
        self._ids = (f"q{i}" for i in itertools.count(1))
        # (query_key, the policy) -> the active ids asking it. Not CLIP's full cleaning (ftfy): that tripled the
        # set-up time of a bundle of 10,000 queries.
        self._same: dict[tuple, list[str]] = {}
        self._out_of_reach_said: set[float] = set()  # said once a threshold: 100 queries at one said it 100 times

    def add(self, text: str, policy: AlertPolicy, message: str | None = None, query_id: str | None = None,
            stream_time: float = 0.0, label: str | None = None, embedding: np.ndarray | None = None,
            stacklevel: int = 4) -> Query:
        """``embedding``: the text's, encoded by the caller; ``stacklevel``: where a warning points (at whoever
        asked the query)."""
        if embedding is None:
            embedding = self.encoder.encode(text)  # refuses an empty or too long query before anything changes
        check_texts(message=message, query_id=query_id, label=label)
        query_id = query_id or next(self._ids)
        if query_id in self.queries:
            raise UserError(f"query id {query_id!r} is already in use; remove it first or pick another id")
        query = Query(query_id, text, message or text, policy, stream_time, label)
        self._register(query, stacklevel)
        self.queries[query_id], self._rows[query_id] = query, embedding
        self._matrix = self._levels = self._positions = None
        self.changes += 1
        return query

    def _register(self, query: Query, stacklevel: int) -> None:
        """Index ``query`` by what it asks (``_same``), with a warning where an active one asks the same."""
        same = self._same.setdefault((query_key(query.text), dataclasses.astuple(query.policy)), [])
        if same:  # a client that re-adds its queries on every reconnect doubles every alert
            warnings.warn(f"the query {query.text!r} is already active as {same[0]} under the same alert policy: each "
                          f"event will alert twice; keep the first one's id, or remove_query({same[0]!r}) before "
                          "adding it again", DuplicateQueryWarning, stacklevel=stacklevel)
        same.append(query.id)
        threshold = query.policy.threshold
        out_of_reach = never_reached_words(threshold) or below_every_score_words(threshold)
        if out_of_reach and threshold not in self._out_of_reach_said:
            self._out_of_reach_said.add(threshold)
            warnings.warn(f"the threshold {threshold:g} of query {query.id} ({query.text!r}, and of any query given it "
                          f"after) {out_of_reach}", ThresholdOutOfReachWarning, stacklevel=stacklevel)

    def _unregister(self, query: Query) -> None:
        key = (query_key(query.text), dataclasses.astuple(query.policy))
        self._same[key].remove(query.id)
        if not self._same[key]:  # a program asking new texts for months keeps no trace of the removed ones
            del self._same[key]

    def remove(self, query: str | Query) -> str:
        """-> the id of the query removed."""
        query_id = self.id_of(query)
        query = self.queries.pop(query_id)
        del self._rows[query_id]
        self._unregister(query)
        self._matrix = self._levels = self._positions = None
        self.changes += 1
        return query_id

    def set_policy(self, query: str | Query, policy: AlertPolicy, label: str | None) -> Query:
        """Another policy and label for an active query; its embedding and row stay (the set did not change)."""
        query = self.queries[self.id_of(query)]
        check_texts(label=label)
        self._unregister(query)
        query.policy, query.label = policy, label
        self._levels = None
        self._register(query, stacklevel=5)
        return query

    def id_of(self, query: str | Query) -> str:
        """The id of an active query, named by its id or by the ``Query`` that ``add`` returned (what a program
        holds; as a key it failed as unhashable)."""
        if isinstance(query, Query) and self.queries.get(query.id) is query:
            return query.id
        if isinstance(query, str) and query in self.queries:
            return query
        # A refusal: only now are the active ids listed (every call did it, for however many queries are asked).
        active = f"active ids: {', '.join(self.queries) or 'none'}"
        if isinstance(query, Query):  # removed, its id perhaps given to another since
            raise UserError(f"the query {query.id} ({query.text!r}) is not active here (removed, or added to "
                            f"another detector); {active}")
        if not isinstance(query, str):
            raise UserError(f"a query is named by its id (text, e.g. 'q1') or by the Query add_query returned, not "
                            f"{reprlib.repr(query)}; {active}")
        raise UserError(f"no query with id {query!r}; {active}")

    def set_message(self, query: str | Query, message: str) -> None:
        query_id = self.id_of(query)
        if not isinstance(message, str):  # sinks write it as text
            raise UserError(f"a query's message is text, not {type(message).__name__}")
        self.queries[query_id].message = message

    @property
    def ids(self) -> list[str]:
        return list(self.queries)

    @property
    def matrix(self) -> np.ndarray:
        """[Q, E] in ``ids`` order."""
        if self._matrix is None:
            rows = [self._rows[qid] for qid in self.queries]
            self._matrix = np.stack(rows).astype(np.float32) if rows else np.zeros((0, 1), np.float32)
        return self._matrix

    @property
    def positions(self) -> dict[str, int]:
        """Each active id's place in ``ids``; a new dict whenever the set changes (a step keeps the one it began
        with, as it keeps its ``ids``)."""
        if self._positions is None:
            self._positions = {qid: q for q, qid in enumerate(self.queries)}
        return self._positions

    def over(self, probs: np.ndarray) -> list[list[int]]:
        """For each stream (a row of ``probs``, [B, Q] from ``scores``), the positions in ``ids`` whose p is above
        their query's threshold, compared as ``AlertState.update`` compares them: both rounded to float32, and NaN
        counted as over (it is not at or below). Most rows have none, told for every stream at once."""
        if self._levels is None:
            self._levels = np.array([q.policy.threshold for q in self.queries.values()], np.float32)
        over = ~(probs.astype(np.float32, copy=False) <= self._levels)
        return [np.flatnonzero(row).tolist() if some else [] for row, some in zip(over, over.any(axis=1).tolist())]

    def graph_input(self, rows: int, width: int) -> np.ndarray:
        """``matrix`` as the query input [rows, width] of a graph that scores its queries itself (exported with
        --fuse-queries, ``rows`` fixed in it), the rows past the active queries zero; made again only when the
        set changes."""
        matrix = self.matrix
        if self._graph_input is None or self._graph_input[0] is not matrix:
            padded = np.zeros((rows, width), np.float32)
            padded[: len(matrix)] = matrix
            self._graph_input = (matrix, padded)
        return self._graph_input[1]

    def scores(self, embeddings: np.ndarray, logits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(cosines, p) [B, Q] of the active queries, in ``ids`` order: a fused graph's own logits [B, rows] where
        it gave them (their first columns are these queries, ``graph_input``), else one product of the
        embeddings [B, E] with ``matrix``."""
        if not self.queries:
            return (np.zeros((len(embeddings), 0)),) * 2
        if logits is not None:
            cosines = logits[:, : len(self.queries)]
            return cosines, probabilities(cosines)
        return score(embeddings, self.matrix)


def text_encoder_for(bundle: str | Path | Bundle, truncate_queries: bool = False,
                     threads: int | None = None) -> TextEncoder:
    """The bundle's text graph and tokenizer, with its pre-encoded queries already in the cache."""
    bundle = as_bundle(bundle)  # a path failed on a missing attribute ('str' object has no attribute 'text_graph')
    if not isinstance(truncate_queries, bool):  # "no" was taken as yes
        raise UserError(f"truncate_queries is True or False, not {truncate_queries!r}")
    encoder = TextEncoder(bundle.text_graph, bundle.tokenizer_vocab, bundle.manifest["tokenizer"]["context_length"],
                          on_overflow="truncate" if truncate_queries else "error", threads=threads)
    pre = bundle.queries()
    if pre:
        encoder.seed([q["text"] for q in pre[0]], pre[1])
    return encoder
