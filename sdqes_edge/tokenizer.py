"""CLIP's byte-pair-encoding tokenizer, exactly as CLIP tokenizes (torch-free).

Text is cleaned with ftfy and HTML unescaping, whitespace is collapsed, the
text is lower-cased, split with CLIP's pattern, mapped to byte-level unicode and
merged with CLIP's 48,894 BPE merges. A query becomes
``[49406, ...tokens..., 49407]`` zero-padded to the context length (77).

A query that does not fit is never cut silently: ``on_overflow="error"`` (the
default) raises a ``UserError``; ``"truncate"`` keeps the first tokens, ends
with the end token, and warns.
"""

from __future__ import annotations

import functools
import gzip
import html
import unicodedata
import warnings
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import ftfy
import numpy as np
import regex

from .config import CLIP_VOCAB_SIZE
from .errors import UserError, is_whole_number

VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
SHIPPED_VOCAB = Path(__file__).parent / "data" / VOCAB_FILE  # in the package (bundles carry a copy)
START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"
CONTEXT_LENGTH = 77
OVERFLOW_POLICIES = ("error", "truncate")
# The vocabulary file: a header line, then merges, of which CLIP uses as many as its vocabulary holds beside its 512
# byte tokens (each byte alone and word-final) and its start and end tokens: 48,894. A merge is two short tokens, so
# no line of it is long.
CLIP_MERGES = CLIP_VOCAB_SIZE - 2 * 256 - 2
LONGEST_MERGE_LINE = 1024

# CLIP's split pattern (case-insensitive): special tokens, English contractions,
# runs of letters, single digits, runs of other non-space characters.
_SPLIT_PATTERN = regex.compile(
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
    regex.IGNORECASE,
)


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from bytes to printable unicode characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes)))


# Texts whose cleaning is kept: a run's queries are cleaned to be told apart and again to be tokenized, and ftfy
# takes 0.15 ms a text (a queries file of 11,828 EgoSDQES queries: 5.4 s of 12 s before the stream began).
CLEANED_TEXTS_KEPT = 16384


@functools.lru_cache(maxsize=CLEANED_TEXTS_KEPT)
def clean_text(text: str) -> str:
    """The text CLIP tokenizes: texts that clean alike are one query to the model."""
    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip().lower()


class TooLongQueryError(UserError):
    pass


def read_merges(path: Path) -> list[tuple[str, str]]:
    """The CLIP_MERGES merges of a gzipped BPE vocabulary, read as a stream and no further than they go: a bundle's
    vocabulary is someone else's data, and the whole file decompressed at once let a few megabytes of gzip that
    expand to terabytes take the machine's memory. One that is not CLIP's (another BPE, a garbled file) is refused
    naming it, where a file of one line tokenized every query into bytes and scored it without a word."""
    merges: list[tuple[str, str]] = []
    try:
        with gzip.open(path, "rb") as lines:
            lines.readline(LONGEST_MERGE_LINE)  # the header
            while len(merges) < CLIP_MERGES:
                line = lines.readline(LONGEST_MERGE_LINE + 1)
                if not line:
                    break
                pair = tuple(line.decode("utf-8").split())
                if len(pair) != 2 or len(line) > LONGEST_MERGE_LINE:
                    raise ValueError(f"line {len(merges) + 2} is not a merge of two tokens")
                merges.append(pair)
    except (OSError, EOFError, ValueError, zlib.error) as exc:  # not gzip, cut short, not UTF-8, not merges
        raise UserError(f"{path} is not CLIP's BPE vocabulary ({exc}); re-export the bundle it came with") from None
    if len(merges) < CLIP_MERGES:
        raise UserError(f"{path} is not CLIP's BPE vocabulary (it holds {len(merges):,} merges, CLIP's "
                        f"{CLIP_MERGES:,}); re-export the bundle it came with")
    return merges


class QueryTruncatedWarning(UserWarning):
    """A query over the context length was cut to it (``on_overflow="truncate"``): its end is not scored."""


class QueryScriptWarning(UserWarning):
    """A query written mostly outside the Latin alphabet: CLIP's text tower learnt English captions."""


def non_latin_share(text: str) -> float:
    """The share of a text's letters outside the Latin alphabet (0 for a text without letters)."""
    letters = [c for c in text if c.isalpha()]
    foreign = sum(not unicodedata.name(c, "").startswith("LATIN") for c in letters)
    return foreign / len(letters) if letters else 0.0


class ClipTokenizer:
    """CLIP BPE tokenizer. ``tokenize(["a photo of a cat"])`` gives ids of shape [N, context_length] (CLIP's 77)."""

    def __init__(self, vocab_path: str | None = None, context_length: int = CONTEXT_LENGTH):
        # Fewer than 3 positions hold no word between the start and end tokens: every query was then refused as
        # too long, and a context length given as text failed in a comparison at the first query.
        if not is_whole_number(context_length, least=3):
            raise UserError(f"context_length is the text tower's positions, a whole number of at least 3 (CLIP's "
                            f"{CONTEXT_LENGTH}), not {context_length!r}")
        merge_pairs = read_merges(Path(vocab_path) if vocab_path is not None else SHIPPED_VOCAB)
        byte_chars = list(_bytes_to_unicode().values())
        vocab = byte_chars + [c + "</w>" for c in byte_chars] + ["".join(p) for p in merge_pairs]
        vocab += [START_TOKEN, END_TOKEN]
        self.encoder = {token: i for i, token in enumerate(vocab)}
        self.decoder = {i: token for token, i in self.encoder.items()}
        self.merge_ranks = {pair: i for i, pair in enumerate(merge_pairs)}
        self.byte_encoder = _bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.context_length = int(context_length)
        self.start_id = self.encoder[START_TOKEN]
        self.end_id = self.encoder[END_TOKEN]
        self._cache = {START_TOKEN: START_TOKEN, END_TOKEN: END_TOKEN}
        self._script_said = False  # QueryScriptWarning: once, for the first query so written

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def _bpe(self, token: str) -> str:
        if token in self._cache:
            return self._cache[token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.merge_ranks.get(p, float("inf")))
            if best not in self.merge_ranks:
                break
            first, second = best
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        result = " ".join(word)
        self._cache[token] = result
        return result

    def encode(self, text: str) -> list[int]:
        """BPE ids of the cleaned text, without start/end tokens."""
        ids: list[int] = []
        for piece in _SPLIT_PATTERN.findall(clean_text(text)):
            piece = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self._bpe(piece).split(" "))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        text = "".join(self.decoder[int(i)] for i in ids if int(i) not in (0, self.start_id, self.end_id))
        decoded = bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")
        return decoded.replace("</w>", " ").strip()

    def _say_script(self, text: str) -> None:
        if self._script_said or non_latin_share(text) <= 0.5:
            return
        self._script_said = True
        warnings.warn(f"the query {text[:60]!r} is written mostly outside the Latin alphabet; CLIP's text tower "
                      "learnt English captions, so it is likely to score poorly: ask it in English (said once, for "
                      "any other query so written)", QueryScriptWarning, stacklevel=3)

    def count(self, text: str) -> int:
        """Positions the query takes, start and end tokens included."""
        return len(self.encode(text)) + 2

    def tokenize(self, texts: str | Sequence[str], on_overflow: str = "error") -> np.ndarray:
        """Token ids ``[N, context_length]`` (int64), zero-padded after the end token."""
        if on_overflow not in OVERFLOW_POLICIES:
            raise UserError(f"on_overflow must be one of {OVERFLOW_POLICIES}, not {on_overflow!r}")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, Iterable):  # None failed as "has no len()"
            raise UserError(f"tokenize takes a query text or a list of them, not a {type(texts).__name__}")
        texts = list(texts)
        out = np.zeros((len(texts), self.context_length), dtype=np.int64)
        for row, text in enumerate(texts):
            check_query_text(text)
            self._say_script(text)
            ids = [self.start_id] + self.encode(text) + [self.end_id]
            if len(ids) > self.context_length:
                if on_overflow == "error":
                    raise TooLongQueryError(
                        f"query is {len(ids)} tokens, over the model's limit of {self.context_length}: "
                        f"{text[:60]!r}...; shorten it, or allow truncation (on_overflow='truncate', "
                        "--truncate-queries on the command line)"
                    )
                warnings.warn(
                    f"query truncated from {len(ids)} to {self.context_length} tokens: {text[:60]!r}...",
                    QueryTruncatedWarning, stacklevel=2,
                )
                ids = ids[: self.context_length - 1] + [self.end_id]
            out[row, : len(ids)] = ids
        return out


def check_query_text(text: str) -> str:
    """What makes a text a query at all; the exporter and the runtime both refuse through here."""
    if not isinstance(text, str):  # "a query is empty" said of a number
        raise UserError(f"a query is text, not {type(text).__name__}: give the event to wait for, e.g. "
                        "'when I start cooking'")
    if not text.strip():
        raise UserError("a query is empty; give the event to wait for, e.g. 'when I start cooking'")
    return text


def vocab_path() -> Path:
    """The BPE vocabulary shipped in the package (bundles carry a copy)."""
    return SHIPPED_VOCAB


@functools.lru_cache(maxsize=4)
def default_tokenizer(context_length: int = CONTEXT_LENGTH) -> ClipTokenizer:
    """The tokenizer with the vocabulary shipped in the package (loaded once per context length: a model's text
    tower reads ``TextConfig.context_length`` positions, CLIP's 77 unless its checkpoint has another)."""
    return ClipTokenizer(context_length=context_length)
