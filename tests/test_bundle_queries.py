"""A bundle's pre-encoded queries are two files, the texts (queries.json) and their embeddings
(query_embeddings.npy), and row q of the one is taken as the embedding of text q. Files changed together with
their sha256 in the manifest (a query added by hand, another export's embeddings copied in) passed every check:
each text then got its neighbour's embedding, or a width the scores cannot use, and alerts answered other
queries without a word. Such a pair is refused as the bundle loads, in one line naming the files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sdqes_edge.files import file_sha256
from sdqes_edge.runtime.bundle import BundleError, load_bundle

VECTORS_BUNDLE = Path(__file__).resolve().parent / "vectors" / "bundle"  # pre-encoded: one query, width 32


def resealed(tmp_path, texts=None, embeddings=None, count=None) -> Path:
    """The vectors bundle with its queries replaced and their sha256 (and count) written into the manifest, as
    a hand edit that knows the format would leave it."""
    bundle = tmp_path / "bundle"
    shutil.copytree(VECTORS_BUNDLE, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    if texts is not None:
        (bundle / "queries.json").write_text(json.dumps(texts))
    if embeddings is not None:
        with open(bundle / "query_embeddings.npy", "wb") as out:  # np.save of a path appends .npy to odd names
            np.save(out, embeddings)
    for name in ("queries.json", "query_embeddings.npy"):
        manifest["files"][name] = {"sha256": file_sha256(bundle / name), "bytes": (bundle / name).stat().st_size}
    if count is not None:
        manifest["queries"]["count"] = count
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def test_the_pre_encoded_queries_of_an_export_load_row_for_text():
    texts, embeddings = load_bundle(VECTORS_BUNDLE).queries()
    assert [q["text"] for q in texts] == ["When I start to clean the table, remind me to wash my hands."]
    assert embeddings.shape == (1, 32) and embeddings.dtype == np.float32


ONE = [{"text": "when I start cooking", "response": "Wash your hands."}]
TWO = ONE + [{"text": "when I open the fridge", "response": "Close it."}]
ROW = np.ones((1, 32), np.float32)
NOT_QUERIES = r"queries.json is not a list of \{text, response\[, label\]\[, threshold in \(0, 1\)\]\} objects"


@pytest.mark.parametrize("texts, embeddings, count, says", [
    (TWO, None, 2, r"query_embeddings.npy is float32 \(1, 32\), not float32 \(2, 32\): one embedding per query"),
    (TWO, None, None, r"queries.json holds 2 queries, manifest.json says 1"),
    (None, np.ones((1, 48), np.float32), None, r"query_embeddings.npy is float32 \(1, 48\), not float32 \(1, 32\)"),
    (None, ROW.astype(np.float64), None, r"query_embeddings.npy is float64 \(1, 32\), not float32 \(1, 32\)"),
    (None, ROW * np.nan, None, "query_embeddings.npy holds NaN or infinite values"),
    ({"text": "when I start cooking"}, None, None, NOT_QUERIES),
    ([{"text": 3}], None, None, NOT_QUERIES),
    ([{"text": "when I cook", "label": 3}], None, None, NOT_QUERIES),
    (None, np.array([{"a": 1}], dtype=object), None, "Object arrays cannot be loaded when allow_pickle=False"),
], ids=["a query added to the texts only", "texts and count disagree", "another model's width", "float64",
        "NaN", "an object, not a list", "a text that is a number", "a label that is a number", "a pickled array"])
def test_queries_whose_texts_and_embeddings_disagree_are_refused_as_the_bundle_loads(texts, embeddings, count,
                                                                                     says, tmp_path):
    bundle = resealed(tmp_path, texts, embeddings, count)
    with pytest.raises(BundleError, match=f"^the pre-encoded queries of {bundle} are unusable \\(.*{says}") as caught:
        load_bundle(bundle)
    assert "\n" not in str(caught.value) and str(caught.value).endswith(f"--out {bundle})")


def test_queries_changed_together_with_their_embeddings_and_count_still_load(tmp_path):
    """The check is of agreement, not of the export: two queries, two rows and a count of two are a bundle."""
    bundle = resealed(tmp_path, TWO, np.ones((2, 32), np.float32), count=2)
    texts, embeddings = load_bundle(bundle).queries()
    assert [q["text"] for q in texts] == [q["text"] for q in TWO] and embeddings.shape == (2, 32)


def test_a_bundles_alert_message_is_shown_on_the_terminal_not_obeyed(tmp_path):
    """The message is someone else's data: "\\x1b[2K\\r" in it erased the alert's line on the terminal and wrote
    another in its place. Its control characters are printed as escapes; the alert log keeps the message as it is."""
    import subprocess
    import sys

    import cv2

    from sdqes_edge.demo import DEMO_BUNDLE

    message = "Wash your hands.\x1b[2K\rFAKE LINE\x1b]0;title\x07"
    bundle = tmp_path / "bundle"  # the demo's, its one query's message the bundle's own
    shutil.copytree(DEMO_BUNDLE, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "queries.json").write_text(json.dumps([{"text": "when I start cooking", "response": message}]))
    with open(bundle / "query_embeddings.npy", "wb") as out:
        np.save(out, np.eye(1, manifest["embed_dim"], dtype=np.float32))
    manifest["queries"] = {"count": 1, "file": "queries.json", "embeddings": "query_embeddings.npy"}
    for name in ("queries.json", "query_embeddings.npy"):
        manifest["files"][name] = {"sha256": file_sha256(bundle / name), "bytes": (bundle / name).stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    frames = tmp_path / "frames"
    frames.mkdir()
    for k in range(3):
        cv2.imwrite(str(frames / f"{k:03d}.png"), np.full((40, 60, 3), 40 * k, np.uint8))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(frames),
                           "--threshold", "0.01", "--events", str(tmp_path / "alerts.jsonl")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Wash your hands.\\x1b[2K\\rFAKE LINE\\x1b]0;title\\x07   (query q1" in done.stdout
    assert not any(c in done.stdout for c in "\x1b\r\x07")
    assert json.loads((tmp_path / "alerts.jsonl").read_text().splitlines()[0])["message"] == message
