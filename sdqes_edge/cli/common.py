"""What every subcommand shares: the program name, the model options, output checks, one help style.

Help style: ``help`` is a short phrase; a default is written "(default %(default)s)" so argparse fills it
from the value actually used; defaults and choices are imported from the module that defines them.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from pathlib import Path
from typing import TextIO, TypeVar

from sdqes_edge import package_builds
from sdqes_edge.config import ADAPTER_KINDS, preset, with_authors_adapter
from sdqes_edge.contract import MAX_FPS
from sdqes_edge.errors import EXTRA_FOR_MODULE, WARNING_PREFIX, install_command, module_absent, terminal_safe
from sdqes_edge.files import free_name
from sdqes_edge.path_checks import check_output_dir, check_output_file
from sdqes_edge.train_options import MAX_SEED

Line = TypeVar("Line", bound=tuple)  # a query: its text first, then what comes with it (message, label)

PROG = "sdqes-edge"

def missing_module_words(exc: ModuleNotFoundError, command: str | None) -> str | None:
    """'the export command needs torch, which is not installed here: ...' for an optional module that is absent,
    or None: a module that is installed but broken inside, or one of ours, is a bug whose traceback is needed."""
    module = (exc.name or "").split(".")[0]
    if module not in EXTRA_FOR_MODULE or not module_absent(module):
        return None
    if module in package_builds.PACKAGE_NAMES and package_builds.files_gone(module):
        return package_builds.incomplete_package_words(module)  # not "pip install", which says "already satisfied"
    who = f"the {command} command" if command else "this command"
    return (f"{who} needs {module}, which is not installed here: {install_command(module)} "
            "(a device needs only sdqes-edge[runtime] to run bundles)")


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's parser, refusing a mistake (an unknown option, a bad value) in one line on stderr with exit
    status 2, as every other refusal of this program is; the usage it would print first is a --help away.
    Subcommand parsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {terminal_safe(message)} (see {self.prog} --help)\n")


def stray_words_hint(parser: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> str:
    """What to do about words left over on a command line, for the end of its "unrecognized arguments" line, or ''.

    Words left over after an option that takes one value are most often a value of several words without quotes
    (``--query when I start cooking``: --query took 'when') or a shell glob after an option given once per value
    (``--source videos/*.mp4``: --source took the first file). argparse names only the leftover words."""
    if not unknown or unknown[0].startswith("-"):
        return ""
    for first in (i for i, word in enumerate(argv) if word == unknown[0]):
        before = next((i for i in range(first - 1, -1, -1) if argv[i].startswith("-")), None)
        if before is None:
            continue
        option, _, attached = argv[before].partition("=")
        action = _option_action(parser, option)
        if action is None or action.nargs is not None:  # a flag, or an option that takes a list already
            continue
        after = next((i for i in range(first, len(argv)) if argv[i].startswith("-")), len(argv))
        words = ([attached] if attached else []) + argv[before + 1:after]
        name = action.option_strings[-1]
        if all(os.path.exists(w) for w in words):  # a shell glob's files
            if not isinstance(action, argparse._AppendAction):
                return f"; {name} takes one path, not {len(words)}"
            examples = " ".join(f"{name} {shlex.quote(w)}" for w in words[:2])
            return f"; {name} takes one path: give it once for each ({examples}{' ...' if len(words) > 2 else ''})"
        if action.type in (None, str, path_text):
            return f"; {name} takes one value: quote one of several words ({name} {shlex.quote(' '.join(words))})"
        return f"; {name} takes one value"
    return ""


def _option_action(parser: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """The action of an option as argparse reads it: its full name, or a prefix of just one (``--que``)."""
    actions = parser._option_string_actions  # argparse's own table of option strings
    if option in actions:
        return actions[option]
    matches = {actions[name] for name in actions if name.startswith(option) and option.startswith("--")}
    return matches.pop() if len(matches) == 1 else None


class UniqueValues(argparse.Action):
    """For a list option: a value given twice is kept once, with a one-line warning (``--seeds 0 0`` trained the
    same model twice for one result). Order is kept."""

    def __call__(self, parser, namespace, values, option_string=None):
        unique = list(dict.fromkeys(values))
        if len(unique) < len(values):
            repeated = [str(v) for v in unique if values.count(v) > 1]
            warn(f"{option_string} lists {', '.join(repeated)} more than once; each is used once")
        setattr(namespace, self.dest, unique)


def text_key(text: str) -> str:
    """A query's text as queries are told apart on the command line: as CLIP's tokenizer cleans it."""
    from sdqes_edge.tokenizer import clean_text  # ftfy and regex: not for building the parsers

    return clean_text(text)


def unique_queries(queries: list[Line]) -> list[Line]:
    """Queries ((text, message, ...) tuples) without a text given twice, said in one warning line however many
    are (an annotations file passed whole repeats hundreds): texts that CLIP's tokenizer cleans alike ("Cooking "
    and "cooking") are one query, and watching it twice alerted twice on every event. The first keeps its message
    (and label, and threshold)."""
    kept: dict[str, Line] = {}
    repeated: list[str] = []
    dropped: list[tuple[Line, Line]] = []  # (a repeat whose message, label or threshold differs, the line kept)
    for line in queries:
        key = text_key(line[0])
        if key in kept:
            repeated.append(line[0])
            if tuple(line[1:]) != tuple(kept[key][1:]):
                dropped.append((line, kept[key]))
        else:
            kept[key] = line
    # Two reminders for one event ("Wash your hands!", "Put on gloves!") cannot both be watched: which one is kept
    # is said, where the second had been dropped without a word.
    unused = f"; its first line's {_what_differs(*dropped[0])} is kept" if dropped else ""
    if len(repeated) == 1:
        warn(f"the query {repeated[0]!r} is given more than once (case and spacing aside); it is watched once{unused}")
    elif repeated:
        others = f" ({len(dropped)} with another alert message, label or threshold there)" if dropped else ""
        warn(f"{len(repeated)} queries are given more than once (case and spacing aside), e.g. {repeated[0]!r}; "
             f"each is watched once, as its first line says{others}")
    return list(kept.values())


def _what_differs(line: tuple, first: tuple) -> str:
    """"alert message 'Wash!' (not 'Gloves!')": what a repeated query's first line gives that its repeat gives
    otherwise."""
    names = getattr(first, "_fields", ("text", "message", "label", "threshold"))[1:]
    return " and ".join(f"{'alert message' if name == 'message' else name} {value!r} (not {other!r})"
                        for name, value, other in zip(names, first[1:], line[1:]) if value != other)


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def at_least(minimum: int):
    """An argparse type for a whole number no smaller than ``minimum``: anything else is refused in one line
    that names the option ("argument --threads: give at least 1, not -2"), before any work starts."""
    return _no_less_than(minimum, _whole_number, "")


def seconds_at_least(minimum: float):
    """An argparse type for a duration in seconds no shorter than ``minimum``, refused in one line that names the
    option ("argument --stream-timeout: give at least 0.1 s, not 0")."""
    return _no_less_than(minimum, finite_number, " s")


def _no_less_than(minimum: float, read, unit: str):
    def shown(number: float) -> str:  # a whole number in full, a real one short ("0.1", not "0.1000000")
        return f"{number:g}" if isinstance(number, float) else str(number)

    def number(text: str):
        value = read(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"give at least {shown(minimum)}{unit}, not {shown(value)}")
        return value

    return number


def seed_number(text: str) -> int:
    """An argparse type for a random seed, refused in one line outside 0 .. ``MAX_SEED``."""
    value = _whole_number(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"give a seed from 0 to {MAX_SEED}, not {value}")
    return value


def frames_per_second(text: str) -> float:
    """An argparse type for a sampling rate, refused in one line outside (0, ``MAX_FPS``]: a negative or zero rate
    reached the synthetic scenes' stream-length check, worded for another mistake, and 2000 fps drew frames for
    minutes that no bundle could step."""
    value = finite_number(text)
    if not 0.0 < value <= MAX_FPS:
        raise argparse.ArgumentTypeError(f"give a positive number of frames per second up to {MAX_FPS:g}, not {text}")
    return value


def path_text(text: str) -> str:
    """A path option's value, refused when empty: an unset shell variable (--out "$OUT") became Path(""), the
    current folder, which an export would then replace, a score search and an inspect read."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty (an unset shell variable?); give one")
    return text


def finite_number(text: str) -> float:
    """An argparse type for a real number: NaN and infinities, which Python's float() reads, are refused (no
    range check can catch a NaN: every comparison with it is false)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"give a finite number, not {text}")
    return value


def run_hint(bundle, manifest: dict, options: str = "--source VIDEO") -> str:
    """The `run` command to try a bundle with: on its own pre-encoded queries where it has them (a --query would
    replace them all), else with --query TEXT."""
    return f"{PROG} run {bundle} {options}" + ("" if manifest.get("queries") else " --query TEXT")


def add_subcommand(sub: argparse._SubParsersAction, name: str, help: str, description: str,
                   examples: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """A subcommand parser in the house style: a one-line help, a description, examples in the epilog."""
    epilog = "examples:\n" + "\n".join(f"  {PROG} {name} {example}" for example in examples) if examples else None
    parser = sub.add_parser(name, help=help, description=description, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(command_parser=parser)  # so an option it lacks is refused in its name (cli.run)
    return parser


def add_adapter_option(parser: argparse.ArgumentParser, help: str = "swap the preset's adapter kind (authors' "
                                                                    "settings)") -> None:
    parser.add_argument("--adapter", choices=ADAPTER_KINDS, help=help)


def model_from_args(args: argparse.Namespace):
    """(model, description) from --checkpoint or --preset/--adapter."""
    from sdqes_edge.model import SDQESModel

    if getattr(args, "checkpoint", None):
        from sdqes_edge.checkpoints import load_resolving_unstored

        model, ckpt, unstored = load_resolving_unstored(args.checkpoint)
        return model, f"{args.checkpoint} ({ckpt.source_format}, sha256 {ckpt.sha256[:12]}; {unstored.rule})"
    import torch

    cfg = preset(args.preset)
    if args.adapter and args.adapter != cfg.adapter.kind:
        cfg = with_authors_adapter(cfg, args.adapter)
    seed = getattr(args, "seed", None) or 0  # None: not given
    with torch.random.fork_rng():  # the same --seed, the same weights, without touching the caller's generator
        torch.manual_seed(seed)
        model = SDQESModel(cfg).eval()
    return model, f"preset {cfg.name} (random weights, seed {seed})"


def show(line: str, file: TextIO | None = None) -> None:
    """A line built from what the command was given (paths, source and stream names, someone else's texts), printed
    with its control characters shown, not obeyed; blank lines before it are the layout's own and kept."""
    text = line.lstrip("\n")
    print("\n" * (len(line) - len(text)) + terminal_safe(text), file=file)


def folder_for_new_results(out: str, results_file: str) -> str:
    """``out``, or where it holds an earlier run's ``results_file`` or another run is writing it, the first free of
    OUT-2, OUT-3, ... (said): a second run into the same folder replaced the first's results, a 15-minute bench's by
    a quick one's, and two at once wrote one folder between them, the last to finish each file winning. The results
    file is held (runtime.output_locks) until the command ends."""
    from sdqes_edge.runtime.output_locks import HeldByAnotherRun, hold

    folder = Path(out)
    while True:
        if (folder / results_file).exists():
            why = "holds an earlier run's results, which are kept"
        else:
            try:
                hold(folder / results_file, "--out", f"results ({results_file})", folder=folder)
                break
            except HeldByAnotherRun as held:
                why = f"is being written by another run ({held.holder})"
        fresh = free_name(Path(out))
        say(f"note: {folder} {why}; this run writes to {fresh}")
        folder = fresh
    return str(folder)


def say(message: str) -> None:
    """A line of the run's own on stderr (a source's news, what streams), after the program's name: it names sources
    and paths the user gave, so its control characters are shown, not obeyed, as in a warning."""
    show(f"{PROG}: {message}", file=sys.stderr)


def warn(message: str) -> None:
    """A warning of the command line's: one line on stderr, after the program's name."""
    say(f"warning: {message}")


def say_error(message: str) -> None:
    """A refusal or failure of the command line's: one line on stderr, after the program's name; its words may quote
    a file, a bundle or a flag the user gave, so their control characters are shown, not obeyed."""
    say(f"error: {message}")


def onnxruntime_gpu_here() -> bool:
    """Whether ONNX Runtime could step on a GPU here: an NVIDIA driver loaded and this build offering the CUDA
    provider (``sdqes-edge doctor`` goes on to make a session). For the commands that default to the CPU to say so."""
    from sdqes_edge.package_builds import CUDA_PROVIDER, load_onnxruntime
    from sdqes_edge.runtime.tensorrt_backend import nvidia_gpu_present

    return nvidia_gpu_present() and CUDA_PROVIDER in load_onnxruntime().get_available_providers()


def given_flags(args: argparse.Namespace, *names: str) -> list[str]:
    """The options among ``names`` that the command line set (their flags), in that order."""
    # By identity: 0 == False, so "not in (None, False)" took --vision-heads 0 or --threshold 0 for not given.
    return ["--" + name.replace("_", "-") for name in names
            if getattr(args, name) is not None and getattr(args, name) is not False]


def progress_log(quiet: bool):
    """A library's log for the command line: its "warning: ..." lines as the command's warnings (stderr, even with
    --quiet, since they are not progress), everything else on stdout unless --quiet."""
    def log(message: str) -> None:
        if message.startswith(WARNING_PREFIX):
            warn(message[len(WARNING_PREFIX):])
        elif not quiet:
            print(message)
    return log


def check_output_paths(args: argparse.Namespace) -> None:
    """Every output a subcommand declares (``output_files``, ``output_dirs``) checked before any work starts."""
    for attr, example in getattr(args, "output_files", {}).items():  # example: a name for the file
        if getattr(args, attr, None):
            check_output_file(getattr(args, attr), "--" + attr.replace("_", "-"), example)
    for attr in getattr(args, "output_dirs", ()):
        if getattr(args, attr, None):
            check_output_dir(getattr(args, attr), "--" + attr.replace("_", "-"))
