"""Queries with their alert messages from a file: `export --queries-file` and `run --queries-file`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import NamedTuple, Optional

from sdqes_edge.annotations import other_separator_words
from sdqes_edge.errors import UserError
from sdqes_edge.files import USER_TEXT_ENCODING, path_problem

QUERIES_FILE_HELP = (".txt (one query a line), .json or .csv (query,response columns, and label where the bundle "
                     "has per-label thresholds)")


class QueryLine(NamedTuple):
    """A query as the user wrote it: its text, its alert message (None: the text) and its label (None: none).
    The label picks the bundle's threshold for that label (``eval --calibrate --per-label --write-threshold``)."""

    text: str
    message: Optional[str] = None  # typing's Optional: Python 3.8 evaluates a NamedTuple's annotations
    label: Optional[str] = None


def read_queries_file(path: str) -> list[QueryLine]:
    """Queries with their alert messages (and labels) from .txt (one query a line), .json or .csv
    (query[,response][,label], as the EgoSDQES annotations name them)."""
    p = Path(path)
    problem = path_problem(p, "file")
    if problem:
        raise UserError(f"queries file {p} {problem}; give a .txt, .json or .csv file of queries")
    try:
        text = p.read_text(encoding=USER_TEXT_ENCODING)
    except UnicodeDecodeError as exc:
        raise UserError(f"{p} is not UTF-8 text ({exc}); save it as UTF-8") from None
    kind = p.suffix.lower()  # QUERIES.CSV too: read as lines, its header was taken for the first query
    if kind == ".json":
        queries = _json_queries(text, p)
    elif kind == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if not reader.fieldnames or "query" not in reader.fieldnames:
            raise UserError(f"{p} needs a 'query' column (and optionally 'response', the alert message)"
                            + other_separator_words(reader.fieldnames))
        queries = [QueryLine(row["query"] or "", row.get("response") or row["query"] or "",
                             (row.get("label") or "").strip() or None) for row in reader]
    else:
        queries = [QueryLine(line.strip(), line.strip()) for line in text.splitlines() if line.strip()]
    if not queries:
        raise UserError(f"{p} holds no queries; give one query a line (.txt), a JSON list or a CSV with a 'query' "
                        "column")
    return queries


def _json_queries(text: str, p: Path) -> list[QueryLine]:
    shape = 'a JSON list of strings or of {"text": ..., "response": ..., "label": ...}'
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{p} is not valid JSON ({exc}); give {shape}") from None
    if not isinstance(items, list):
        raise UserError(f"{p} holds a JSON {type(items).__name__}; give {shape}")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(QueryLine(item, item))
        elif isinstance(item, dict) and all(isinstance(item.get(k, ""), str) for k in ("text", "response", "label")) \
                and "text" in item:
            label = item.get("label", "").strip() or None
            out.append(QueryLine(item["text"], item.get("response", item["text"]), label))
        else:
            raise UserError(f"{p}: each entry must be a string or {{\"text\": ..., \"response\": ..., \"label\": ...}} "
                            f"of strings, got {item!r}")
    return out
