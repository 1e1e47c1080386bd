"""Words left over on a command line: argparse names them; the refusal also says the likely fix."""

from __future__ import annotations

import numpy as np
import pytest
from eval_fixtures import step_trace, write_annotations

from sdqes_edge.cli import run
from sdqes_edge.traces import StreamScores, save_scores


@pytest.mark.parametrize("argv, says", [
    (["run", "b", "--source", "v.mp4", "--query", "when", "I", "start", "cooking"],
     "unrecognized arguments: I start cooking; --query takes one value: quote one of several words "
     "(--query 'when I start cooking')"),
    # the bundle given last: argparse took the query's second word as the bundle
    (["run", "--query", "when", "I", "cook", "--source", "v.mp4", "b"],
     "--query takes one value: quote one of several words (--query 'when I cook')"),
    (["run", "b", "--source", "v.mp4", "--query", "x", "--mess", "wash", "your", "hands"],
     "(--message 'wash your hands')"),  # an option's unique prefix, as argparse takes it
    (["export", "--preset", "tiny", "--out", "my", "bundle"], "(--out 'my bundle')"),
    (["run", "b", "--source", "my", "video.mp4"], "(--source 'my video.mp4')"),
    (["run", "b", "--source", "0", "--threshold", "0.5", "0.6"], "unrecognized arguments: 0.6; --threshold takes "
                                                                "one value (see"),
    (["run", "b", "stray", "--source", "0"], "unrecognized arguments: stray (see"),  # after no option
    (["run", "b", "--source", "0", "--quiet", "stray"], "unrecognized arguments: stray (see"),
])
def test_words_left_over_after_an_option_say_how_to_quote_them(argv, says, capsys):
    """The commonest command-line slip of a tool that takes sentences: a query without quotes."""
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert says in err, err


def test_a_glob_after_source_says_to_give_it_once_per_stream(tmp_path, capsys, monkeypatch):
    """``--source videos/*.mp4``: the shell's files, each an existing path, after an option given once per stream."""
    monkeypatch.chdir(tmp_path)
    for name in ("a.mp4", "b.mp4", "c.mp4"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SystemExit):
        run(["run", "bundle", "--source", "a.mp4", "b.mp4", "c.mp4", "--query", "x"])
    assert ("unrecognized arguments: b.mp4 c.mp4; --source takes one path: give it once for each "
            "(--source a.mp4 --source b.mp4 ...)") in capsys.readouterr().err


def test_files_after_an_option_that_takes_one_path_are_not_told_to_be_quoted(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text("")
    with pytest.raises(SystemExit):
        run(["eval", "--annotations", "a.csv", "b.csv", "--baseline", "oracle"])
    assert "unrecognized arguments: b.csv; --annotations takes one path, not 2 (see" in capsys.readouterr().err


def test_tokenize_of_single_words_notes_that_each_argument_is_a_query(capsys):
    """tokenize takes several queries, so an unquoted one is read, without a word, as one query a word."""
    assert run(["tokenize", "when", "I", "start", "cooking"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("tokens") == 4
    assert captured.err == ("sdqes-edge: note: each argument is a query of its own; quote a query of several words: "
                            "sdqes-edge tokenize 'when I start cooking'\n")
    assert run(["tokenize", "when I start cooking", "cooking"]) == 0 and capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [
    ["run", "/no/such/\x1b[2K\rbundle", "--source", "0", "--query", "q"],  # the program's refusal
    ["run", "b", "--source", "0", "\x1b[2K\rstray"],  # argparse's
])
def test_a_refusal_shows_the_control_characters_it_quotes_rather_than_obeying_them(argv, capsys):
    """A path or a word given may hold them (a file named by another program, a paste): "\x1b[2K\r" erased the
    error's line on the terminal, leaving the user to wonder why the command did nothing."""
    try:
        code = run(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "\\x1b[2K\\r" in err and "\x1b" not in err and len(err.strip().splitlines()) == 1, err


def test_a_line_built_from_what_was_given_shows_its_control_characters_and_keeps_the_blank_lines_before_it(capsys):
    from sdqes_edge.cli.common import show

    show("\n\nwrote \x1b[2J\rout/\x07trace.npz\nnext")
    assert capsys.readouterr().out == "\n\nwrote \\x1b[2J\\rout/\\x07trace.npz\\nnext\n"


@pytest.mark.parametrize("options, says", [
    (["--max-alerts", "0"], "sdqes-edge run: error: argument --max-alerts: give at least 1, not 0 (see"),
    (["--cooldown", "-1"], "sdqes-edge run: error: argument --cooldown: give at least 0 s, not -1 (see"),
    (["--threshold", "1.5"], "sdqes-edge: error: --threshold 1.5 is outside (0, 1): it is a probability sigmoid(cos)"),
    (["--threshold", "0.9"], "sdqes-edge: error: --threshold 0.9 is never reached: p = sigmoid(cos) is at most 0.7311 "
     "(a cosine is at most 1), so any query at it never alerts; give one between 0.2689 and 0.7311 (a calibrated "
     "one: sdqes-edge eval --calibrate)"),
    (["--exit-threshold", "1"], "sdqes-edge: error: --exit-threshold 1 is outside [0, 1): a query stays on until its "
                                "p falls to it, a probability sigmoid(cos)"),
    (["--threshold", "0.5", "--exit-threshold", "0.9"], "sdqes-edge: error: --exit-threshold 0.9 is above --threshold "
     "0.5: a query stays on until its p falls to it, so give one at or below the threshold"),
])
def test_an_alert_policy_option_out_of_range_is_refused_naming_the_option_before_the_bundle_is_read(options, says,
                                                                                                  capsys):
    """The alert policy's own words ("max alerts 0 must be at least 1") named no option, and came only once the
    bundle was loaded and its queries encoded."""
    try:  # argparse's own refusals exit; the command's return their status
        code = run(["run", "no-such-bundle", "--source", "0", "--query", "when I start cooking", *options])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(says), err


@pytest.mark.parametrize("command", [["synth", "--out", "data"], ["train"], ["accuracy"],
                                     ["export", "--preset", "tiny"], ["eval", "--annotations", "a.csv", "--baseline",
                                                                      "oracle"]])
@pytest.mark.parametrize("fps", ["0", "-1", "2000"])
def test_a_frame_rate_no_bundle_can_step_is_refused_by_every_command_that_takes_one(command, fps, capsys):
    """synth drew 2000 frames a second for minutes (no bundle steps above 1000), and refused 0 or -1 as streams too
    short to show every event; train refused them after it had parsed every other option."""
    with pytest.raises(SystemExit) as exit_:
        run([*command, "--fps", fps])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert f"argument --fps: give a positive number of frames per second up to 1000, not {fps} (see" in err


@pytest.mark.parametrize("option, value, least", [("--frames", "1", 2), ("--batch", "0", 1)])
def test_check_names_the_one_option_that_is_out_of_range(option, value, least, capsys):
    """"--frames must be >= 2 and --batch >= 1" named both, whichever was wrong."""
    with pytest.raises(SystemExit) as exit_:
        run(["check", option, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert f"argument {option}: give at least {least}, not {value} (see sdqes-edge check --help)" in err


def test_an_option_given_as_zero_counts_as_given():
    """0 == False: `--vision-heads 0` beside --preset was taken for not given, so the warning that it is ignored
    was never said."""
    import argparse

    from sdqes_edge.cli.common import given_flags

    args = argparse.Namespace(vision_heads=0, text_heads=None, shared_bundle=False, threshold=0.0)
    assert given_flags(args, "vision_heads", "text_heads", "shared_bundle", "threshold") == ["--vision-heads",
                                                                                             "--threshold"]


def test_a_soak_block_of_no_frames_is_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        run(["check", "--soak", "20000", "--soak-block", "0"])
    assert "argument --soak-block: give at least 1, not 0 (see sdqes-edge check --help)" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, says", [
    ("--precision", "fp16", "has no fp16 step graph (it has fp32, int8); re-export with --precision fp16"),
    ("--ort-ops", "/no/such/libsdqes_ort_ops.so", "no kernel library at /no/such/libsdqes_ort_ops.so"),
])
def test_inspect_refuses_what_it_cannot_run_before_printing_half_a_report(option, value, says, capsys):
    from sdqes_edge.demo import DEMO_BUNDLE

    assert run(["inspect", str(DEMO_BUNDLE), option, value]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, (out, err)


@pytest.mark.parametrize("option, value", [("--frames", "100000000"), ("--batch", "100000")])
def test_check_refuses_streams_whose_window_form_cannot_fit_in_memory_before_any_work(option, value, capsys,
                                                                                       monkeypatch):
    """The window form holds every frame of every stream at once: --frames 100000000 ended in PyTorch's allocation
    traceback, and --batch 100000 grew to 19 GB in a minute on a 23-GB machine before the kernel killed it."""
    import sdqes_edge.sample

    monkeypatch.setattr(sdqes_edge.sample, "available_memory", lambda: 4 * 2**30)
    assert run(["check", option, value]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert "GiB is free); ask for less: fewer streams (--batch), fewer frames, or a smaller model" in err


def test_an_eval_option_of_the_baselines_given_without_them_is_said_not_taken_without_a_word(tmp_path, capsys):
    """--fps is the baselines' sampling rate and --seed the random one's: given with score traces alone, each did
    nothing, and a user who meant the traces' rate was not told that eval reads each trace at its own."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 10.0)])
    save_scores(tmp_path / "traces" / "v1.npz", StreamScores("v1", 1.0, ["When I cook, remind me."], ["q1"],
                                                             np.zeros(1), step_trace(60, [11])[:, None]))
    argv = ["eval", "--annotations", str(csv), "--scores", str(tmp_path / "traces"), "--plots", "0"]
    assert run(argv + ["--fps", "2", "--seed", "3", "--out", str(tmp_path / "out")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sdqes-edge: warning:")]
    assert warnings == ["sdqes-edge: warning: --fps 2 is the baselines' sampling rate, and score traces keep the rate "
                        "they were recorded at: it does nothing without --baseline oracle/random; leave it out",
                        "sdqes-edge: warning: --seed 3 seeds the random baseline: it does nothing without --baseline "
                        "random; leave it out"]
    assert run(argv + ["--baseline", "random", "--fps", "2", "--seed", "3", "--out", str(tmp_path / "out2")]) == 0
    assert "warning" not in capsys.readouterr().err
