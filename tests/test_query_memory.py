"""A program on a device runs for months and asks new texts all along (a voice command each, a ROS topic): what
the detector keeps for them stays bounded. Embeddings of texts no longer asked are dropped, the least recently
asked first (``TEXT_CACHE_SIZE``); the bundle's pre-encoded queries and the active ones are never encoded again,
and a removed query leaves nothing behind.
"""

from __future__ import annotations

import numpy as np

from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.queries import TEXT_CACHE_SIZE, text_encoder_for
from sdqes_edge.runtime.sources import Frame

TEXTS = [f"when I start to open drawer number {n}" for n in range(12)]


def counting_runs(encoder) -> list[str]:
    """The texts the encoder's text graph runs on, from now on."""
    ran = []
    run = encoder.session.run
    encoder.session = type("Counted", (), {"run": lambda self, out, feeds: ran.append(feeds) or run(out, feeds)})()
    return ran


def test_the_text_cache_keeps_the_most_recently_asked_texts_up_to_its_size(exported):
    _, bundle = exported
    encoder = text_encoder_for(load_bundle(bundle))
    assert encoder.cache_size == TEXT_CACHE_SIZE
    encoder.cache_size = 3
    first = {text: encoder.encode(text).copy() for text in TEXTS}
    assert len(encoder._cache) == 3 and list(encoder._cache) == TEXTS[-3:]
    ran = counting_runs(encoder)
    encoder.encode(TEXTS[-1])  # kept: no text graph run
    assert ran == []
    np.testing.assert_array_equal(encoder.encode(TEXTS[0]), first[TEXTS[0]])  # dropped: encoded again, the same
    assert len(ran) == 1 and len(encoder._cache) == 3


def test_active_queries_keep_their_embeddings_and_removed_ones_leave_nothing(exported):
    _, bundle = exported
    detector = StreamingDetector(bundle)
    detector.queries.encoder.cache_size = 2
    kept = detector.add_query(TEXTS[0])
    frame = Frame(image=np.full((40, 48, 3), 120, np.uint8), time=0.0, index=0)
    detector.step([frame])
    before = detector.queries.scores(detector.last_embeddings)[1].copy()
    for text in TEXTS[1:]:  # each asked and withdrawn, pushing TEXTS[0] out of the cache
        detector.remove_query(detector.add_query(text).id)
    ran = counting_runs(detector.queries.encoder)
    detector.add_query(TEXTS[1])  # the set changes: its matrix is made again
    probs = detector.queries.scores(detector.last_embeddings)[1]
    assert len(ran) == 1  # only the new text ran; the active query's row was kept, not encoded again
    np.testing.assert_array_equal(probs[:, :1], before)
    assert len(detector.queries.encoder._cache) <= 2
    assert len(detector.queries._same) == len(detector.queries.queries) == 2
    assert set(detector.queries._rows) == {kept.id, detector.queries.ids[1]}
