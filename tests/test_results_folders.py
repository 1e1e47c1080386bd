"""Where ``bench`` and ``eval`` write their results (``cli.common.folder_for_new_results``): never over an earlier
run's, nor into a folder another run is writing, and a refused command leaves no folder of its own behind."""

from __future__ import annotations

import subprocess
import sys

from runtime_fixtures import another_run_writing

from sdqes_edge.benchmarks import suite
from sdqes_edge.cli import run as cli


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdqes_edge.cli", *args], capture_output=True, text=True)


def test_a_bench_into_a_folder_holding_an_earlier_runs_results_keeps_them_and_writes_beside_it(tmp_path, monkeypatch,
                                                                                               capsys):
    """`bench --quick` after a 15-minute `bench`, both into the default folder, replaced the full run's results (and
    a Ctrl-C a few seconds in left a partial bench.json in their place)."""
    out = tmp_path / "bench-results"
    out.mkdir()
    (out / "bench.json").write_text('{"complete": true, "config": {"preset": "clip-vit-b16"}}')
    written = []

    def measured(cfg, log):  # what the suite writes, without the minutes of measuring
        written.append(cfg.out)
        folder = suite.Path(cfg.out)
        folder.mkdir(parents=True, exist_ok=True)  # as the suite does: held, it is there
        (folder / "bench.json").write_text("{}")
        (folder / "bench.md").write_text("# the quick run\n")
        return {"seconds": 1.0}, [folder / "bench.json", folder / "bench.md"]

    monkeypatch.setattr(suite, "run", measured)
    assert cli(["bench", "--quick", "--out", str(out)]) == 0
    assert written == [str(tmp_path / "bench-results-2")]
    assert (out / "bench.json").read_text() == '{"complete": true, "config": {"preset": "clip-vit-b16"}}'
    said = capsys.readouterr()
    assert f"note: {out} holds an earlier run's results, which are kept; this run writes to {out}-2" in said.err
    assert "# the quick run" in said.out and f"results go to {out}-2/" in said.out


def test_a_bench_into_a_folder_another_bench_is_writing_writes_beside_it(tmp_path, monkeypatch, capsys):
    """Two at once wrote one folder between them: a quick run's bench.md beside a full run's bench.json."""
    out = tmp_path / "bench-results"
    written = []

    def measured(cfg, log):  # what the suite writes, without the minutes of measuring
        written.append(cfg.out)
        (suite.Path(cfg.out) / "bench.md").write_text("# the quick run\n")
        return {"seconds": 1.0}, [suite.Path(cfg.out) / "bench.md"]

    monkeypatch.setattr(suite, "run", measured)
    with another_run_writing(out, "bench.json") as first:  # as a bench holds its --out until it ends
        assert cli(["bench", "--quick", "--out", str(out)]) == 0
    assert written == [str(tmp_path / "bench-results-2")] and not (out / "bench.md").exists()
    assert (f"note: {out} is being written by another run (pid {first.pid}, sdqes-edge); this run writes to {out}-2"
            in capsys.readouterr().err)


def test_an_eval_into_a_folder_holding_an_earlier_evals_report_keeps_it_and_writes_beside_it(egosdqes_csv, tmp_path):
    """eval.json and eval.md were replaced, and the earlier run's plots of other queries left among the new ones."""
    out = tmp_path / "sdqes-eval"
    common = ("eval", "--annotations", str(egosdqes_csv), "--plots", "0", "--out", str(out))
    first = run_cli(*common, "--baseline", "oracle")
    assert first.returncode == 0, first.stderr
    report = (out / "eval.json").read_text()
    again = run_cli(*common, "--baseline", "random")
    assert again.returncode == 0, again.stderr
    assert f"note: {out} holds an earlier run's results, which are kept; this run writes to {out}-2" in again.stderr
    assert (out / "eval.json").read_text() == report
    assert "random" in (tmp_path / "sdqes-eval-2" / "eval.json").read_text()


def test_an_eval_into_a_folder_another_eval_is_writing_writes_beside_it(egosdqes_csv, tmp_path):
    """Two at once wrote one folder between them: each file the last to finish left, the plots of both mixed."""
    out = tmp_path / "sdqes-eval"
    with another_run_writing(out, "eval.json") as first:  # as an eval holds its --out until it ends
        done = run_cli("eval", "--annotations", str(egosdqes_csv), "--plots", "0", "--baseline", "oracle",
                       "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert (f"note: {out} is being written by another run (pid {first.pid}, sdqes-edge); this run writes to {out}-2"
            in done.stderr)
    assert not (out / "eval.json").exists() and "oracle" in (tmp_path / "sdqes-eval-2" / "eval.json").read_text()


def test_a_command_refused_after_taking_its_folder_leaves_no_empty_folder_behind(tmp_path):
    """Holding its results made --out before anything was checked, and a refusal (here: no such annotations) left
    that folder empty behind it."""
    done = run_cli("eval", "--annotations", str(tmp_path / "nope.csv"), "--baseline", "oracle",
                   "--out", str(tmp_path / "new" / "eval-out"))
    assert done.returncode == 2 and "annotation file" in done.stderr
    assert list(tmp_path.iterdir()) == []
