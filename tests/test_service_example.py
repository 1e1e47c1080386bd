"""The systemd unit and logrotate file in docs/service/ say what sdqes-edge does: the command in the unit is one
`sdqes-edge run` takes and runs, twice in a row as a restarted service would, and the exit statuses it names are
the ones the command gives."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_fixtures import QUERY, write_video

from sdqes_edge.cli import build_parser
from sdqes_edge.cli.stream import LOST_SOURCE_EXIT
from sdqes_edge.errors import UserError
from sdqes_edge.sample import sample_frames

SERVICE = Path(__file__).resolve().parents[1] / "docs" / "service"
UNIT = SERVICE / "sdqes-edge.service"


def unit_settings(unit: Path = UNIT) -> dict[str, str]:
    """The unit's Key=Value lines (each key once in our units), with the backslash-continued ExecStart joined."""
    text = unit.read_text().replace("\\\n", " ")
    lines = (line.strip() for line in text.splitlines())
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def exec_start(unit: Path = UNIT) -> list[str]:
    return shlex.split(unit_settings(unit)["ExecStart"])


def test_the_units_command_is_one_sdqes_edge_run_takes():
    argv = exec_start()
    assert Path(argv[0]).name == "sdqes-edge"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.source == ["0"]
    assert args.state and args.events and args.queries_file and not (args.resume or args.save_state)


def test_the_exit_statuses_the_unit_names_are_the_ones_run_gives():
    settings = unit_settings()
    assert settings["SuccessExitStatus"] == str(128 + signal.SIGTERM)  # a stop: stopping.exit_code_of
    assert settings["RestartPreventExitStatus"] == str(UserError.exit_code)  # a mistake: restarting cannot mend it
    assert settings["Restart"] == "on-failure" and str(LOST_SOURCE_EXIT) not in (
        settings["SuccessExitStatus"], settings["RestartPreventExitStatus"])  # a camera gone for good: started again


def test_logrotate_rotates_the_alert_log_the_unit_writes():
    lines = [line.strip() for line in (SERVICE / "sdqes-edge.logrotate").read_text().splitlines()]
    directives = [line for line in lines if line and not line.startswith("#")]
    assert directives[0] == build_parser().parse_args(exec_start()[1:]).events + " {"
    assert not {"copytruncate", "postrotate"} & set(directives)  # run follows a moved log by itself


def test_the_units_command_runs_and_a_restart_resumes_where_it_stopped(exported, tmp_path):
    """The unit's command with its paths moved under tmp_path and a video for the camera."""
    _, bundle = exported
    video = write_video(tmp_path / "camera.avi", sample_frames(12, 60, 80))
    argv = exec_start()
    args = build_parser().parse_args(argv[1:])
    moved = {args.bundle: str(bundle), "0": str(video)}
    for path in (args.queries_file, args.events, args.state):
        moved[path] = str(tmp_path / Path(path).relative_to("/"))
        Path(moved[path]).parent.mkdir(parents=True, exist_ok=True)
    Path(moved[args.queries_file]).write_text(f"query,response\n{QUERY},Time to look.\n")
    command = [sys.executable, "-m", "sdqes_edge.cli", *(moved.get(word, word) for word in argv[1:])]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert Path(moved[args.state]).is_file() and Path(moved[args.events]).exists()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)  # systemd's restart
    assert again.returncode == 0, again.stderr
    assert "the run it resumes had streamed it to its end" in again.stderr  # resumed, not begun afresh
    assert all(json.loads(line) for line in Path(moved[args.events]).read_text().splitlines())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("example", [UNIT, SERVICE / "sdqes-run.service"], ids=lambda path: path.name)
def test_systemd_reads_the_unit_without_a_complaint(example, tmp_path):
    """The unit's program stands in for an installed sdqes-edge or sdqes-run (systemd checks that it can be run)."""
    unit = tmp_path / example.name
    unit.write_text(example.read_text().replace(exec_start(example)[0], "/bin/true"))
    checked = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr


def test_run_help_lists_the_exit_statuses_the_unit_names():
    """A service's author reads them in `sdqes-edge run --help`, not in the code."""
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", "--help"], capture_output=True, text=True,
                          timeout=60)
    statuses = " ".join(done.stdout.split("exit status:")[1].split())
    settings = unit_settings()
    for status, meaning in ((settings["SuccessExitStatus"], "stopped by Ctrl-C, SIGTERM"),
                            (settings["RestartPreventExitStatus"], "a mistake in the command"),
                            (str(LOST_SOURCE_EXIT), "a camera or stream that cannot be opened or was lost")):
        assert status in statuses and meaning in statuses, statuses


def test_the_annotated_video_the_unit_suggests_is_options_run_takes():
    suggested = re.search(r"add: (--annotate .*)\n", UNIT.read_text()).group(1).split()
    args = build_parser().parse_args([*exec_start()[1:], *suggested])
    assert args.annotate.endswith(".mp4") and args.annotate_keep == 72 and args.annotate_segment is None


def test_the_unit_waits_for_ready_and_its_watchdog_outlasts_a_stalled_stream_and_its_reconnection():
    """Type=notify: `run` says READY=1 and pings the watchdog per frame (sdqes_edge.service_manager). A stream that
    stalls steps nothing for FFmpeg's read timeout (30 s, OpenCV's) and then the reconnection attempts: the watchdog
    must not kill a run that is about to reconnect."""
    from sdqes_edge.runtime.live_source import RECONNECT_DELAYS_S

    settings = unit_settings()
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert int(settings["WatchdogSec"]) > 30 + sum(RECONNECT_DELAYS_S)
