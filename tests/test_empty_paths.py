"""An empty path on the command line is refused, for every option that names a file or folder. In a script an
unset variable (--out "$OUT") passes "", which became Path(""), the current folder: `export --out ""` replaced the
bundle the shell stood in, `score --videos ""` searched the working tree, `run --source ""` streamed its images."""

from __future__ import annotations

import argparse

import pytest

from sdqes_edge.cli import build_parser, run
from sdqes_edge.cli.common import path_text

# Every option's destination that names a file or a folder, in any command.
PATH_DESTINATIONS = {"out", "bundle", "source", "annotations", "scores", "videos", "checkpoint", "model_config",
                     "calibration_video", "queries_file", "events", "annotate", "resume", "save_state",
                     "write_threshold"}


def path_options() -> list[tuple[str, argparse.Action]]:
    """(command, action) of each option of each command whose value is a path."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    return [(name, action) for name, parser in commands.items() for action in parser._actions
            if action.dest in PATH_DESTINATIONS and not (action.dest == "source" and name in ("eval", "score"))]


def test_every_option_that_names_a_file_or_folder_checks_its_path():
    """--source of eval and score is an annotation source (moments, nlq), not a path."""
    unchecked = [f"{command} {action.option_strings or action.dest}" for command, action in path_options()
                 if action.type is not path_text]
    assert path_options() and unchecked == []


@pytest.mark.parametrize("command, action", path_options(),
                         ids=[f"{c}-{a.dest}" for c, a in path_options()])
@pytest.mark.parametrize("empty", ["", "  "], ids=["empty", "spaces"])
def test_an_empty_path_is_refused_in_one_line_before_any_work(command, action, empty, capsys):
    argv = [command, *(action.option_strings[:1] or []), empty]
    with pytest.raises(SystemExit) as exited:
        run(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    option = action.option_strings[0] if action.option_strings else action.dest
    assert f"argument {option}" in err and "the path is empty (an unset shell variable?)" in err
    assert err.count("\n") == 1


def test_an_export_to_the_current_folder_replaces_the_bundle_it_was_run_in(tmp_path, monkeypatch, capsys):
    """`--out .` inside a bundle (what an empty --out had meant) staged its new bundle inside the old one and then
    failed renaming "." (OSError: Device or resource busy), in a traceback, after all the work."""
    import json

    bundle = tmp_path / "bundle"
    assert run(["export", "--preset", "tiny", "--adapter", "qrnn", "--out", str(bundle), "--quiet"]) == 0
    monkeypatch.chdir(bundle)
    assert run(["export", "--preset", "tiny", "--adapter", "st", "--out", ".", "--quiet"]) == 0
    assert json.loads((bundle / "manifest.json").read_text())["model"]["adapter"]["kind"] == "st"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging or retired folder left
    assert not [p for p in bundle.iterdir() if p.name.startswith(".")]
    capsys.readouterr()
