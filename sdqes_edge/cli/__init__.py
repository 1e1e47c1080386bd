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
import errno
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
    stray_words_hint,
    warn,
)
from sdqes_edge.cli.output import prepare_output
from sdqes_edge.errors import UserError, module_absent
from sdqes_edge.path_checks import path_form_words
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


# A full disk (or quota) is the machine's state, not a bug: one line, like every refusal, with what to do.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def _machine_refusal_words(exc: OSError) -> str | None:
    """What to say of a write the machine refused (a full disk, a file past its file system's largest, a disk gone
    read-only or failing, permissions taken away after the up-front checks: the machine's state, not a bug of
    ours), or None for any other OSError."""
    where = f" writing {exc.filename}" if exc.filename else ""
    if exc.errno in DISK_FULL_ERRNOS:
        return f"the disk is full{where} ({exc.strerror}); free some space or write to another disk, and run again"
    if exc.errno == errno.EFBIG:  # an SD card's FAT32 holds 4 GiB a file; `ulimit -f` caps a shell's files
        return (f"a file grew past the largest its file system or this process allows{where} ({exc.strerror}: "
                "FAT32 holds 4 GiB a file, and `ulimit -f` may set a limit); write to a disk whose file system holds "
                "larger files (ext4, exFAT), or raise the limit, and run again")
    if exc.errno == errno.EROFS:  # an SD card or eMMC the kernel remounted read-only after errors
        return (f"the disk is read-only{where} ({exc.strerror}: the kernel remounts a failing SD card or eMMC "
                "read-only, see `dmesg`); write to another disk, or mount it writable, and run again")
    if exc.errno in (errno.EACCES, errno.EPERM) and exc.filename:  # paths are checked up front: changed since
        return (f"{exc.filename}: {exc.strerror}, where the command's checks found it usable (were its permissions "
                "changed while it ran?); give a path this user may use, and run again")
    if exc.errno == errno.EIO:
        return (f"the disk failed{where} ({exc.strerror}: see `dmesg`; an SD card wears out); check it or write to "
                "another disk, and run again")
    return None


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
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:  # a workstation's command on a device that has the runtime alone
        words = missing_module_words(exc, getattr(args, "command", None))
        if words is None:
            raise
        print(f"{PROG}: error: {words}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # what was asked for does not fit (an export --batch of 100000 streams)
        print(f"{PROG}: error: out of memory{f' ({exc})' if str(exc) else ''}; ask for less: fewer streams "
              "(--batch), fewer frames, or a smaller model", file=sys.stderr)
        return 1
    except OSError as exc:
        words = _machine_refusal_words(exc)
        if words is not None:
            print(f"{PROG}: error: {words}", file=sys.stderr)
            return 1
        words = path_form_words(exc, exc.filename) if exc.filename else None
        if words is None:
            raise  # anything else is a bug of ours, and its traceback is what a report needs
        # A path a check up front did not reach (--resume's): the user's, so a mistake's status.
        print(f"{PROG}: error: {words}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt as interrupt:  # from start-up on: no traceback for a stop, whenever it comes
        print(f"{PROG}: interrupted ({signal.Signals(signal_of(interrupt)).name})", file=sys.stderr)
        return exit_code_of(interrupt)


def main() -> None:
    prepare_output()
    code = run(sys.argv[1:])
    ignore_termination()  # done, outputs closed: a signal in Python's teardown must not make it a kill (-15)
    exit_process(code)  # (without that teardown where a thread is left inside a stalled camera's open or read)
