"""The ``sdqes-edge`` command line: one entry point, one subcommand per job, one module per command group.

Every subcommand checks its arguments up front, reports a user's mistake as one line with a non-zero exit
(no traceback), and ends by printing the next command worth running. Parsers are built without importing
torch; each handler imports what its job needs.

    common      PROG, shared options and checks, the help style
    model       info, check, tokenize
    training    synth, train, accuracy
    evaluate    eval
    bench       bench
    export      export, inspect, build-engine
    ort_ops     build-ort-ops (this project's ONNX Runtime kernels)
    stream      run (a video, camera or stream, with alerts); run_device: what run says about where it steps
    score       score (a corpus: a local worker pool or Ray)
    demo        demo
    doctor      doctor (what this machine can run)
"""

from __future__ import annotations

import argparse
import signal
import sys
import warnings
from typing import Callable, Sequence

from sdqes_edge import __version__, package_builds
from sdqes_edge.cli.common import (
    PROG,
    OneLineErrorParser,
    check_output_paths,
    missing_module_words,
    say_error,
    stray_words_hint,
    warn,
)
from sdqes_edge.cli.output import prepare_output
from sdqes_edge.cli.output_locks import release_outputs
from sdqes_edge.cli.refusals import refusal_words
from sdqes_edge.errors import UserError, module_absent
from sdqes_edge.stopping import exit_code_of, exit_process, ignore_termination, raise_on_termination, signal_of

__all__ = ["PROG", "build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: this module is the entry point, and a Ctrl-C while Python imports the
    # subcommands (OpenCV, jsonschema: most of a second on a small board) must reach ``run``'s handler.
    from sdqes_edge.cli import bench, demo, doctor, evaluate, export, model, ort_ops, score, stream, training

    parser = OneLineErrorParser(
        prog=PROG,
        description="Streaming Detection of Queried Event Start on edge devices: load CLIP-style models with "
                    "streaming temporal adapters, check them, export them to verified deployment bundles, run "
                    "them on a video or camera with alerts, measure their cost and score their accuracy.",
        epilog=f"Start with: {PROG} doctor   |   {PROG} demo   |   {PROG} check   |   {PROG} export --preset tiny "
               f"--adapter qrnn --out /tmp/b   |   {PROG} run /tmp/b --source VIDEO --query TEXT",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    model.add_parsers(sub)
    evaluate.add_parser(sub)
    bench.add_parser(sub)
    training.add_parsers(sub)
    export.add_parsers(sub)
    ort_ops.add_parser(sub)
    stream.add_parser(sub)
    score.add_parser(sub)
    demo.add_parser(sub)
    doctor.add_parser(sub)
    return parser


def _prepare_opencv() -> None:
    """Where OpenCV is installed: refuse one another wheel's uninstall emptied, before the runtime's modules use it
    as they load, and quiet its logs (this program reports a source's problems itself, in one line). Where it is
    not, a command that needs it says so when it loads it; the base install's commands (tokenize, info) need none."""
    if module_absent(package_builds.OPENCV):
        return
    package_builds.check_opencv()
    from sdqes_edge.runtime.sources import quiet_opencv_logs

    quiet_opencv_logs()


def run(argv: Sequence[str] | None, parser_factory: Callable[[], argparse.ArgumentParser] = build_parser) -> int:
    with warnings.catch_warnings():  # the caller's warning display is back as it was when the command ends
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        return _run(argv, parser_factory)


def _one_line_warnings(previous: Callable) -> Callable:
    """This package's own warnings (a step graph slow on its provider, ...) in the command line's one-line form,
    as its refusals are; any other as Python shows it (file, line and source)."""
    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.startswith("sdqes_edge."):
            warn(str(message))
        else:
            previous(message, category, filename, lineno, file, line)
    return show


def _run(argv: Sequence[str] | None, parser_factory: Callable[[], argparse.ArgumentParser]) -> int:
    raise_on_termination()  # SIGTERM/SIGHUP unwind like Ctrl-C: staging folders removed, outputs closed
    args = None
    try:
        parser = parser_factory()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # refused by the subcommand's parser, so the message points at that command's --help
            command_parser = getattr(args, "command_parser", parser)
            hint = stray_words_hint(command_parser, list(sys.argv[1:] if argv is None else argv), unknown)
            command_parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        if not getattr(args, "checks_its_own_packages", False):  # doctor reports a broken OpenCV, not refuses it
            _prepare_opencv()
        check_output_paths(args)
        return args.func(args)
    except UserError as exc:
        say_error(str(exc))
        return exc.exit_code
    except ModuleNotFoundError as exc:  # a workstation's command on a device that has the runtime alone
        words = missing_module_words(exc, getattr(args, "command", None))
        if words is None:
            raise
        say_error(words)
        return 2
    except MemoryError as exc:  # what was asked for does not fit (an export --batch of 100000 streams)
        say_error(f"out of memory{f' ({exc})' if str(exc) else ''}; ask for less: fewer streams "
                  "(--batch), fewer frames, or a smaller model")
        return 1
    except OSError as exc:
        said = refusal_words(exc)
        if said is None:
            raise  # anything else is a bug of ours, and its traceback is what a report needs
        say_error(said[0])
        return said[1]
    except KeyboardInterrupt as interrupt:  # from start-up on: no traceback for a stop, whenever it comes
        print(f"{PROG}: interrupted ({signal.Signals(signal_of(interrupt)).name})", file=sys.stderr)
        return exit_code_of(interrupt)
    finally:
        release_outputs()  # the outputs a run locked (cli/output_locks.py)


def main() -> None:
    prepare_output()
    code = run(sys.argv[1:])
    ignore_termination()  # done, outputs closed: a signal in Python's teardown must not make it a kill (-15)
    exit_process(code)  # (without that teardown where a thread is left inside a stalled camera's open or read)
