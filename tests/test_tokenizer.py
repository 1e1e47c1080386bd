"""CLIP tokenization, exactly: known ids, every EgoSDQES query, and the over-length policy."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from sdqes_edge.errors import UserError
from sdqes_edge.tokenizer import (
    CONTEXT_LENGTH,
    ClipTokenizer,
    QueryTruncatedWarning,
    TooLongQueryError,
    default_tokenizer,
)


@pytest.fixture(scope="module")
def tok() -> ClipTokenizer:
    return default_tokenizer()


def test_known_clip_ids(tok):
    ids = tok.tokenize("a photo of a cat")
    assert ids.shape == (1, CONTEXT_LENGTH) and ids.dtype == np.int64
    assert ids[0, :7].tolist() == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert not ids[0, 7:].any()


def test_vocabulary_has_clips_size_and_special_tokens(tok):
    assert tok.vocab_size == 49408
    assert (tok.start_id, tok.end_id) == (49406, 49407)


def test_text_is_cleaned_as_clip_does(tok):
    """ftfy, double HTML unescape, whitespace collapsed, lower case: all give the same ids."""
    plain = tok.tokenize("a photo of a cat & a dog")
    assert (tok.tokenize("  A   PHOTO of a\tcat &amp;amp; a Dog \n") == plain).all()


def test_decode_inverts_encode(tok):
    assert tok.decode(tok.tokenize("remind me to wash my hands")[0]) == "remind me to wash my hands"


def test_every_egosdqes_query_tokenizes_and_the_longest_is_47_tokens(tok, egosdqes_csv):
    with open(egosdqes_csv, newline="") as fh:
        queries = [row["query"] for row in csv.DictReader(fh)]
    assert len(queries) == 12_767
    lengths = [tok.count(q) for q in queries]
    assert max(lengths) == 47
    ids = tok.tokenize(queries[:500])
    assert (ids.argmax(axis=1) == np.array(lengths[:500]) - 1).all()  # the end token closes each query


def test_a_query_over_77_tokens_is_refused_by_default(tok):
    long_query = "remind me when " + " ".join(["the person picks up the red cup"] * 12)
    with pytest.raises(TooLongQueryError, match="over the model's limit of 77.*truncat"):
        tok.tokenize(long_query)
    assert issubclass(TooLongQueryError, UserError)


def test_truncation_is_an_explicit_choice_and_warns(tok):
    long_query = " ".join(["cooking"] * 100)
    with pytest.warns(QueryTruncatedWarning, match="truncated from 102 to 77"):
        ids = tok.tokenize(long_query, on_overflow="truncate")
    assert ids[0, -1] == tok.end_id and (ids[0] != 0).all()


def test_an_unknown_overflow_policy_is_refused(tok):
    with pytest.raises(UserError, match="on_overflow"):
        tok.tokenize("hi", on_overflow="ignore")
