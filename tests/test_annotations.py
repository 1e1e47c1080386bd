"""EgoSDQES annotations: loading, grouping, and the oracle / random baselines on the real validation set."""

from __future__ import annotations

import csv
import io
import re
import time

import pytest

from sdqes_edge.annotations import by_video, load_annotations, oracle_traces, random_traces, require_annotations
from sdqes_edge.errors import UserError
from sdqes_edge.metrics import calibrate, evaluate


def test_validation_split_has_3029_queries_and_keeps_the_alert_message(egosdqes_csv):
    val = load_annotations(str(egosdqes_csv), split="val")
    assert len(val) == 3029
    assert all(a.response for a in val)
    assert len(load_annotations(str(egosdqes_csv))) == 12_767
    assert {a.source for a in load_annotations(str(egosdqes_csv), source="nlq")} == {"nlq"}
    assert sum(len(v) for v in by_video(val).values()) == 3029


def test_the_oracle_scores_100_and_0_on_all_validation_queries_quickly(egosdqes_csv):
    started = time.perf_counter()
    val = load_annotations(str(egosdqes_csv), split="val")
    result = evaluate(oracle_traces(val, fps=1.0), threshold=0.5)
    elapsed = time.perf_counter() - started
    print(f"\noracle on {result.queries} validation queries: {elapsed:.1f} s")
    assert result.queries == 3029
    assert all(v == 100.0 for by_k in result.recall.values() for v in by_k.values())
    assert all(v == 0.0 for v in result.min_distance.values())


def test_the_random_baseline_is_seeded_and_far_below_the_oracle(egosdqes_csv):
    val = load_annotations(str(egosdqes_csv), split="val")[:300]
    a, b = random_traces(val, seed=3), random_traces(val, seed=3)
    assert all((x.probs == y.probs).all() for x, y in zip(a, b))
    threshold, _ = calibrate(a)
    result = evaluate(a, threshold)
    print(f"\nrandom baseline (300 val queries): threshold {threshold:.3f}, SR@1[-5,+10] "
          f"{result.recall['[-5,+10]'][1]:.1f}, SMD@1 {result.min_distance[1]:.1f}")
    assert result.recall["[-5,+10]"][1] < 50.0


def test_a_missing_or_foreign_csv_is_refused(tmp_path):
    with pytest.raises(UserError, match="annotation file .* does not exist"):
        load_annotations(str(tmp_path / "none.csv"))
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="missing column"):
        load_annotations(str(other))


@pytest.mark.parametrize("column, value, says", [
    ("video_start_time", "abc", "line 4: video_start_time is 'abc', not a number; fix or remove that row"),
    ("video_start_time", "nan", "line 4: video_start_time is 'nan', not a number"),
    ("video_fps", "0", "line 4: video_fps is '0', not a number > 0"),
    ("video_length", "-30", "line 4: video_length is '-30', not a number >= 0"),
    # a start in milliseconds (or a frame number) lies past the video's end, where no stream could show it
    ("video_start_time", "99999", "line 4: video_start_time 99999 s is past the end of its video ("),
    ("video_length", "1e300", "line 4: video_length is 1e+300 frames, more than a video holds (2147483648: "),
    ("query", " ", "line 4: query is empty; fix or remove that row"),
])
def test_a_row_with_a_bad_value_is_refused_naming_its_line_column_and_value(column, value, says, egosdqes_csv,
                                                                             tmp_path):
    lines = egosdqes_csv.read_text(encoding="utf-8").splitlines()[:6]
    header = lines[0].split(",")
    row = next(csv.reader([lines[3]]))
    row[header.index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(row)
    damaged = tmp_path / "damaged.csv"
    damaged.write_text("\n".join([*lines[:3], out.getvalue().rstrip("\n"), *lines[4:]]) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(says)):
        load_annotations(str(damaged))
    assert len(load_annotations(str(damaged), split="no-such-split")) == 0  # rows of other splits are not read


def test_a_csv_saved_by_excel_with_a_byte_order_mark_reads_as_the_same_annotations(egosdqes_csv, tmp_path):
    """Excel's "CSV UTF-8" starts the file with a byte-order mark, which read as text became part of the first
    column's name: the file was refused for a missing 'split' column that is plainly there."""
    excel = tmp_path / "excel.csv"
    excel.write_bytes(b"\xef\xbb\xbf" + egosdqes_csv.read_bytes())
    assert load_annotations(str(excel), split="val") == load_annotations(str(egosdqes_csv), split="val")


def test_a_csv_a_spreadsheet_separated_with_semicolons_is_refused_saying_so(egosdqes_csv, tmp_path):
    """It was refused for missing every column, each of them there in its header."""
    semicolons = tmp_path / "semicolons.csv"
    semicolons.write_text(egosdqes_csv.read_text(encoding="utf-8").splitlines()[0].replace(",", ";") + "\n")
    with pytest.raises(UserError, match=r"separated by ';', not by commas: save it as comma-separated CSV\)$"):
        load_annotations(str(semicolons))


def test_annotations_saved_as_utf16_with_its_byte_order_mark_are_read_as_the_utf8_file_is(egosdqes_csv, tmp_path):
    """Excel's "Unicode Text" and Notepad's "Unicode": they were refused as "not a UTF-8 CSV file"."""
    text = "\n".join(egosdqes_csv.read_text(encoding="utf-8").splitlines()[:200]) + "\n"
    (tmp_path / "utf8.csv").write_text(text, encoding="utf-8")
    (tmp_path / "utf16.csv").write_bytes(("\ufeff" + text).encode("utf-16-le"))
    read = load_annotations(str(tmp_path / "utf16.csv"))
    assert len(read) > 100 and read == load_annotations(str(tmp_path / "utf8.csv"))
    with pytest.raises(UserError, match="no-such-split"):  # what the file does hold, read again in its encoding
        require_annotations(str(tmp_path / "utf16.csv"), split="no-such-split")


def test_column_names_typed_in_a_spreadsheet_name_the_same_columns(egosdqes_csv, tmp_path):
    """A corpus of one's own, its header typed as "Split, Source, Video_uid, ...": refused as missing every column."""
    header, *rows = egosdqes_csv.read_text(encoding="utf-8").splitlines()[:200]
    (tmp_path / "typed.csv").write_text("\n".join([", ".join(c.capitalize() for c in header.split(",")), *rows]))
    (tmp_path / "as-is.csv").write_text("\n".join([header, *rows]))
    assert load_annotations(str(tmp_path / "typed.csv")) == load_annotations(str(tmp_path / "as-is.csv"))


def test_a_short_row_or_a_file_that_is_not_text_is_refused(egosdqes_csv, tmp_path):
    short = tmp_path / "short.csv"
    short.write_text(egosdqes_csv.read_text(encoding="utf-8").splitlines()[0] + "\ntrain,moments,v1\n")
    with pytest.raises(UserError, match="line 2 has fewer fields than the header"):
        load_annotations(str(short))
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xf0\x28\x8c\x28" * 100)
    with pytest.raises(UserError, match="is not a UTF-8 CSV file"):
        load_annotations(str(binary))


def test_starts_a_little_before_the_video_are_kept_as_egosdqes_has_them(egosdqes_csv):
    early = [a for a in load_annotations(str(egosdqes_csv)) if a.start_time < 0]
    assert len(early) == 15 and all(a.start_frame(1.0) == 0 for a in early)


def test_a_selection_that_matches_nothing_is_refused_with_what_the_file_holds(tmp_path):
    """A corpus of test streams only was refused as having no 'val' annotations (eval's default split), and no
    more; and eval's --source took only EgoSDQES's two sources."""
    from sdqes_edge.annotations import require_annotations
    from sdqes_edge.synthetic import write_dataset

    csv = write_dataset(tmp_path / "d", {"test": [1]}, seconds=20.0)
    assert len(require_annotations(str(csv), split="test", source="temporal")) == 4
    with pytest.raises(UserError, match=r"has no annotations for split 'val'; it has splits test; sources "
                                         r"single_frame, temporal \(choose with --split and --source\)$"):
        require_annotations(str(csv), split="val")
    header_only = tmp_path / "empty.csv"
    header_only.write_text(csv.read_text().splitlines()[0] + "\n")
    with pytest.raises(UserError, match="holds no annotations at all"):
        require_annotations(str(header_only))
