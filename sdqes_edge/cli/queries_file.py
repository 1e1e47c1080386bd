"""Queries with their alert messages from a file: `export --queries-file` and `run --queries-file`."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import NamedTuple, Optional

from sdqes_edge.annotations import other_separator_words, with_typed_columns
from sdqes_edge.errors import UserError
from sdqes_edge.files import encoding_name, parse_json, user_text_encoding
from sdqes_edge.path_checks import path_problem
from sdqes_edge.runtime.alerts import is_probability, never_reached_words

QUERIES_FILE_HELP = (".txt (one query a line), .json or .csv (query,response columns; optionally threshold, the "
                     "query's own, and label, which picks the bundle's threshold for that label)")


class QueryLine(NamedTuple):
    """A query as the user wrote it: its text, its alert message (None: the text), its label and its own alert
    threshold (None: none). The label picks the bundle's threshold for that label (``eval --calibrate --per-label
    --write-threshold``); a threshold of its own comes before any other."""

    text: str
    message: Optional[str] = None  # Optional, not `str | None`: typing.get_type_hints on Python 3.8 evaluates it
    label: Optional[str] = None
    threshold: Optional[float] = None


def read_queries_file(path: str) -> list[QueryLine]:
    """Queries with their alert messages (labels, thresholds) from .txt (one query a line), .json or .csv
    (query[,response][,label][,threshold]: the EgoSDQES annotations' names)."""
    p = Path(path)
    problem = path_problem(p, "file")
    if problem:
        raise UserError(f"queries file {p} {problem}; give a .txt, .json or .csv file of queries")
    encoding = user_text_encoding(p)
    try:
        text = p.read_text(encoding=encoding)
    except UnicodeDecodeError as exc:
        raise UserError(f"{p} is not {encoding_name(encoding)} text ({exc}); save it as UTF-8") from None
    kind = p.suffix.lower()  # QUERIES.CSV too: read as lines, its header was taken for the first query
    if kind == ".json":
        queries = _json_queries(text, p)
    elif kind == ".csv":
        queries = _csv_queries(text, p)
    else:
        queries = _text_queries(text, p)
    if not queries:
        raise UserError(f"{p} holds no queries; give one query a line (.txt), a JSON list or a CSV with a 'query' "
                        "column")
    return queries


def _text_queries(text: str, p: Path) -> list[QueryLine]:
    """One query a line, its own alert message. A tab is a spreadsheet's column break (Excel's "Unicode Text" and
    "Text (Tab delimited)"): read as one query, a line "query<TAB>response" asked for both texts as one event, and
    the header line was a query of its own."""
    lines = [line.strip() for line in text.splitlines()]
    tabbed = next((number for number, line in enumerate(lines, 1) if "\t" in line), None)
    if tabbed is not None:
        raise UserError(f"{p} line {tabbed} holds a tab, as a spreadsheet saved as text separates its columns; save "
                        "it as CSV (a 'query' column, and 'response' for the alert message), or give one query a line")
    return [QueryLine(line, line) for line in lines if line]


# Column names a spreadsheet's author may give the alert message, whose column is 'response' (the EgoSDQES
# annotations' name): read as an unknown column, every message was the query's text, without a word.
MESSAGE_COLUMN_GUESSES = ("message", "alert", "alert message", "reminder", "answer")


def _csv_queries(text: str, p: Path) -> list[QueryLine]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        with_typed_columns(reader)  # "Query, Response": " response" had matched no column
        if not reader.fieldnames or "query" not in reader.fieldnames:
            raise UserError(f"{p} needs a 'query' column (and optionally 'response', the alert message)"
                            + other_separator_words(reader.fieldnames))
        guessed = [name for name in reader.fieldnames if name in MESSAGE_COLUMN_GUESSES]
        if guessed and "response" not in reader.fieldnames:
            raise UserError(f"{p} has a {guessed[0]!r} column, but the alert message's column is 'response' (as in "
                            "the EgoSDQES annotations): rename it, or every alert would show its query's text")
        return [_csv_line(row, p) for row in reader]
    except csv.Error as exc:  # a cell longer than the csv module reads (128 KiB); line_num counts the lines before it
        raise UserError(f"{p} line {reader.line_num + 1} is not CSV this reads ({exc}); fix that line") from None


def _csv_line(row: dict, p: Path) -> QueryLine:
    """A CSV row's query, its alert message (its text where none), label and threshold, each cell stripped as a
    spreadsheet's "a, b" leaves a space."""
    query = (row["query"] or "").strip()
    return QueryLine(query, (row.get("response") or "").strip() or query, (row.get("label") or "").strip() or None,
                     _threshold((row.get("threshold") or "").strip() or None, query, p))


def _threshold(value: str | float | None, query: str | None, p: Path) -> float | None:
    """A line's own threshold (a CSV cell's text or a JSON number), checked as a probability; None: none."""
    if value is None:
        return None
    try:
        number = float(value)  # JSON's true reads 1.0: refused below
    except (TypeError, ValueError):
        number = math.nan
    if not is_probability(number):
        raise UserError(f"{p}: the threshold {value!r} of {query!r} is not a probability sigmoid(cos) in (0, 1); "
                        "give one such as 0.7, or leave it empty for the run's")
    never = never_reached_words(number)  # below every score it alerts once, said as the query is asked
    if never:
        raise UserError(f"{p}: the threshold {value!r} of {query!r} {never}")
    return number


# An entry's keys in a JSON queries file: any other (a "message", a misspelt "respones") was ignored, and its alerts
# showed the query's text.
JSON_QUERY_KEYS = ("text", "response", "label", "threshold")


def _json_queries(text: str, p: Path) -> list[QueryLine]:
    shape = 'a JSON list of strings or of {"text": ..., "response": ..., "label": ..., "threshold": ...}'
    try:
        items = parse_json(text)
    except ValueError as exc:
        raise UserError(f"{p} is not valid JSON ({exc}); give {shape}") from None
    if not isinstance(items, list):
        raise UserError(f"{p} holds a JSON {type(items).__name__}; give {shape}")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(QueryLine(item, item))
        elif isinstance(item, dict) and (unknown := sorted(set(item) - set(JSON_QUERY_KEYS))):  # a typo, "message"
            raise UserError(f"{p}: the entry {item!r} has {', '.join(map(repr, unknown))}, which is no query's key: "
                            f"give {', '.join(JSON_QUERY_KEYS)} (response: the alert message)")
        elif isinstance(item, dict) and all(isinstance(item.get(k, ""), str) for k in ("text", "response", "label")) \
                and "text" in item:
            label = item.get("label", "").strip() or None
            threshold = _threshold(item.get("threshold"), item["text"], p)
            out.append(QueryLine(item["text"], item.get("response", item["text"]), label, threshold))
        else:
            raise UserError(f"{p}: each entry must be a string or {{\"text\": ..., \"response\": ..., \"label\": ...}} "
                            f"of strings (and a \"threshold\" number), got {item!r}")
    return out
