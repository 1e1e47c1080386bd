"""CLIP tokenization, exactly: known ids, every EgoSDQES query, the over-length policy, and a vocabulary that is not
CLIP's refused."""

from __future__ import annotations

import csv
import gzip
import re

import numpy as np
import pytest

from sdqes_edge.errors import UserError
from sdqes_edge.tokenizer import (
    CONTEXT_LENGTH,
    SHIPPED_VOCAB,
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


def gzipped(path, lines: list[bytes]):
    with gzip.open(path, "wb") as out:
        out.write(b"".join(line + b"\n" for line in lines))
    return path


@pytest.mark.parametrize("lines, says", [
    ([b"#version: 0.2"], "it holds 0 merges, CLIP's 48,894"),  # each query tokenized into bytes, without a word
    ([b"#version: 0.2", b"h e", b"three to kens"], "line 3 is not a merge of two tokens"),
    ([b"#version: 0.2", b"\xff\xfe"], "invalid start byte"),
    ([b"#version: 0.2", b"a" * 5000], "line 2 is not a merge of two tokens"),
])
def test_a_vocabulary_that_is_not_clips_bpe_is_refused_naming_it(lines, says, tmp_path):
    vocab = gzipped(tmp_path / "bpe_simple_vocab_16e6.txt.gz", lines)
    with pytest.raises(UserError, match=f"^{vocab} is not CLIP's BPE vocabulary [(].*{says}.*[)]; re-export"):
        ClipTokenizer(str(vocab))


def test_a_vocabulary_is_read_no_further_than_clips_merges_go(tmp_path):
    """A few megabytes of gzip that expand to terabytes were decompressed whole; now a line at most is read past
    the merges (a gigabyte of zeros expands here, and its first line is refused)."""
    vocab = tmp_path / "bpe_simple_vocab_16e6.txt.gz"
    with gzip.open(vocab, "wb") as out:
        for _ in range(64):
            out.write(bytes(1 << 24))
    with pytest.raises(UserError, match="line 2 is not a merge of two tokens"):
        ClipTokenizer(str(vocab))
    with gzip.open(SHIPPED_VOCAB) as shipped, gzip.open(tmp_path / "longer.txt.gz", "wb") as longer:
        longer.write(shipped.read() + b"extra merges\n" * 10)  # what lies past CLIP's merges is not read
    assert ClipTokenizer(str(tmp_path / "longer.txt.gz")).encoder == default_tokenizer().encoder


def test_a_damaged_vocabulary_is_refused_naming_it(tmp_path):
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(SHIPPED_VOCAB.read_bytes()[:100_000])
    with pytest.raises(UserError, match=f"^{cut} is not CLIP's BPE vocabulary [(]Compressed file ended"):
        ClipTokenizer(str(cut))
    not_gzip = tmp_path / "plain.txt.gz"
    not_gzip.write_text("#version: 0.2\nh e\n")
    with pytest.raises(UserError, match=f"^{not_gzip} is not CLIP's BPE vocabulary [(]Not a gzipped file"):
        ClipTokenizer(str(not_gzip))


@pytest.mark.parametrize("context_length", [0, 2, -5, "77", 77.0, True])
def test_a_context_length_that_holds_no_word_or_is_not_whole_is_refused_when_made(context_length):
    """0 or 2 refused every query as too long; "77" failed in a comparison at the first query."""
    with pytest.raises(UserError, match=r"^context_length is the text tower's positions, a whole number of at least 3 "
                                        rf"\(CLIP's 77\), not {re.escape(repr(context_length))}$"):
        ClipTokenizer(context_length=context_length)


def test_tokenize_takes_one_text_any_iterable_of_texts_and_refuses_none(tok):
    one = tok.tokenize("when I start cooking")
    assert np.array_equal(one, tok.tokenize(np.array(["when I start cooking"])))
    assert np.array_equal(one, tok.tokenize(text for text in ["when I start cooking"]))
    with pytest.raises(UserError, match=r"^tokenize takes a query text or a list of them, not a NoneType$"):
        tok.tokenize(None)  # failed as "object of type 'NoneType' has no len()"


def test_a_query_written_mostly_outside_the_latin_alphabet_is_warned_of_once():
    """A headset's user who types the reminder in Japanese got scores of a text tower that learnt English captions,
    and no word of it."""
    import warnings

    tok = ClipTokenizer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok.tokenize(["Cuando empiece a cocinar, recuérdame lavarme las manos.",  # Latin letters: not told
                      "When I start cooking 🍳, remind me to wash my hands."])
        assert caught == []
        tok.tokenize(["料理を始めたら、手を洗うように知らせて。", "Когда я начну готовить, напомни помыть руки."])
    assert [w.category.__name__ for w in caught] == ["QueryScriptWarning"]
    cooking = "料理を始めたら、手を洗うように知らせて。"
    assert str(caught[0].message).startswith(f"the query {cooking!r} is written mostly outside the Latin alphabet; "
                                             "CLIP's text tower learnt English captions")


def test_run_says_a_query_in_another_script_in_one_warning_line(tmp_path, capsys):
    from runtime_fixtures import write_video

    from sdqes_edge.cli import run
    from sdqes_edge.demo import DEMO_BUNDLE

    video = write_video(tmp_path / "clip.avi", np.zeros((2, 48, 64, 3), np.uint8), fps=1.0)
    cooking = "料理を始めたら知らせて"
    assert run(["run", str(DEMO_BUNDLE), "--source", str(video), "--query", cooking, "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "Latin alphabet" in line]
    assert len(warned) == 1 and warned[0].startswith(f"sdqes-edge: warning: the query {cooking!r} is written")
