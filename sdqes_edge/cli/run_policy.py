"""``sdqes-edge run``'s alert policy options (--threshold, --exit-threshold, --cooldown, --max-alerts): checked up
front, each refusal naming its option, and described in the run's header."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sdqes_edge.cli.common import at_least, finite_number, seconds_at_least
from sdqes_edge.errors import UserError

if TYPE_CHECKING:  # the detector loads OpenCV: imported where a command runs, so that --help needs no cv2
    from sdqes_edge.runtime.detector import StreamingDetector


def add_policy_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--threshold", type=finite_number,
                     help="alert threshold on sigmoid(cos) of the queries without their own (a threshold column "
                     "in --queries-file); default: the bundle's, for the query's label where it has one")
    run.add_argument("--exit-threshold", type=finite_number, help="hysteresis: stay 'on' until p falls to this "
                                                                  "(default: the bundle's policy, else the threshold)")
    run.add_argument("--cooldown", type=seconds_at_least(0), help="seconds without a new alert after one (default: "
                                                                  "the bundle's policy, else 0)")
    run.add_argument("--max-alerts", type=at_least(1), help="alerts per query after which it goes quiet")


def check_threshold(threshold: float | None) -> None:
    """--threshold (run's, score's) is a probability, refused in one line naming the option."""
    if threshold is None:
        return
    if not 0.0 < threshold < 1.0:
        raise UserError(f"--threshold {threshold:g} is outside (0, 1): it is a probability sigmoid(cos)")
    from sdqes_edge.runtime.alerts import never_reached_words

    never = never_reached_words(threshold, "any query at it")  # below every score it alerts once: said when asked
    if never:
        raise UserError(f"--threshold {threshold:g} {never}")


def check_policy_args(args: argparse.Namespace) -> None:
    """Each option named in its refusal (the alert policy's own words name none), before a bundle is loaded. An
    --exit-threshold above a query's own threshold, or the bundle's, is refused as that query is added."""
    threshold, exit_threshold = args.threshold, args.exit_threshold
    check_threshold(threshold)
    if exit_threshold is None:
        return
    if not 0.0 <= exit_threshold < 1.0:
        raise UserError(f"--exit-threshold {exit_threshold:g} is outside [0, 1): a query stays on until its p falls "
                        "to it, a probability sigmoid(cos)")
    if threshold is not None and exit_threshold > threshold:
        raise UserError(f"--exit-threshold {exit_threshold:g} is above --threshold {threshold:g}: a query stays on "
                        "until its p falls to it, so give one at or below the threshold")


def policy_options(args: argparse.Namespace) -> dict:
    """The policy options given, as ``StreamingDetector.add_query`` takes them (None: the bundle's, else none)."""
    return dict(exit_threshold=args.exit_threshold, cooldown_s=args.cooldown, max_alerts=args.max_alerts)


def policy_words(detector: StreamingDetector, args: argparse.Namespace) -> str:
    """The alert policy of the run's queries, and how many have a threshold of their own (their line's, or the
    bundle's for their label); where the bundle has thresholds per label that no query can take, what to give."""
    default = detector.default_policy(args.threshold, **policy_options(args))
    queries, labels = detector.queries.queries.values(), detector.bundle.label_thresholds
    own = sum(q.policy.threshold != default.threshold for q in queries)
    words = default.describe() + (f"; {own} at a threshold of their own" if own else "")
    if not labels or args.threshold is not None:  # no label thresholds, or --threshold for the queries without one
        return words
    unknown = sum(bool(q.label) and q.label not in labels for q in queries)
    if unknown:
        words += f"; {unknown} with a label the bundle has no threshold for"
    if not any(q.label in labels for q in queries):
        words += (f"; the bundle's thresholds for {len(labels)} query labels are unused: give each query its "
                  "label, a 'label' column in --queries-file")
    return words
