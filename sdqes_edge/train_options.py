"""What a training run is: its options and the stream seeds of each split. Torch-free, so the command line
and the demo can read them on a device without torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import DEFAULT_FPS, ModelConfig, preset, with_authors_adapter
from .errors import UserError, is_number, is_whole_number

# What `sdqes-edge train` fits a model to (the runtime says so when it runs a model trained here).
SYNTHETIC_TRAINING_DATA = ("synthetic scenes (coloured squares, rolling balls, a door and a lamp drawn by "
                           "`sdqes-edge synth`)")

# More training streams than a record can be believed to count (and than a C++ integer holds exactly).
MAX_RECORDED_STREAMS = 1e15

# Data seeds of each split live in disjoint ranges, so no stream is in two splits whatever the sizes.
SPLIT_SEED_BASE = {"train": 100_000, "val": 200_000, "test": 300_000}
DEMO_SEED = 7  # `sdqes-edge demo`'s stream: below every split's seeds, so no model was trained on it
SPLIT_SEED_SPAN = 100_000
CHECKPOINT_RECORD_KEY = "sdqes_edge_training"

# Seeds are whole numbers from 0 to 2**32 - 1: what numpy's generators and torch's both take (numpy refuses a
# negative seed; torch takes some numpy does not), so a seed means the same to every command.
MAX_SEED = 2**32 - 1


def split_seeds(split: str, count: int) -> list[int]:
    if count > SPLIT_SEED_SPAN:
        raise UserError(f"at most {SPLIT_SEED_SPAN} streams per split, not {count}")
    return list(range(SPLIT_SEED_BASE[split], SPLIT_SEED_BASE[split] + count))


def is_training_seed(seed: int) -> bool:
    """Whether a stream seed belongs to a split some training run may have used."""
    return any(base <= seed < base + SPLIT_SEED_SPAN for base in SPLIT_SEED_BASE.values())


@dataclass(frozen=True)
class TrainOptions:
    adapter: str = "qrnn"
    seed: int = 0  # initialisation and batch order; the data does not depend on it
    preset: str = "synthetic"
    train_streams: int = 120
    val_streams: int = 40
    test_streams: int = 60
    stream_seconds: float = 60.0
    fps: float = DEFAULT_FPS
    window: int = 32  # frames per training window
    batch: int = 8  # windows per step
    steps: int = 2400
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_steps: int = 40
    # BCE weight of a true (frame, query) pair; None: negatives per positive in the training labels (about 41).
    # Balance matters with an unscaled cosine: below it the best constant score is cos = -1, where the gradient
    # through the L2 normalisation vanishes and training stalls.
    pos_weight: float | None = None
    grad_clip: float = 1.0
    threads: int | None = None

    def model_config(self) -> ModelConfig:
        return with_authors_adapter(preset(self.preset), self.adapter)

    def check(self) -> "TrainOptions":
        from .synthetic import stream_length_problem  # numpy: the command line's parsers import this module

        # "not 0 < x" refuses NaN too; a negative --grad-clip (a norm bound) would flip every gradient, and an
        # infinite rate, weight or decay turns every weight to NaN (the command line's parsers refuse it too).
        problems = [f"--{name.replace('_', '-')} must be positive, not {getattr(self, name)}"
                    for name in ("fps", "stream_seconds", "lr", "pos_weight", "grad_clip")
                    if getattr(self, name) is not None and not 0 < getattr(self, name) < math.inf]
        positive = self.fps > 0 and self.stream_seconds > 0
        if positive and (too_short := stream_length_problem(self.stream_seconds, self.fps)):
            problems.append(f"{too_short}; raise --stream-seconds or --fps")
        if self.window < 2:
            problems.append(f"--window must be at least 2 frames, not {self.window}")
        elif positive and self.window > int(self.stream_seconds * self.fps):
            problems.append(f"--window {self.window} is longer than a stream ({int(self.stream_seconds * self.fps)} "
                            "frames); lower it or raise --stream-seconds")
        for name in ("train_streams", "val_streams", "test_streams", "steps", "batch"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")
        problems += [f"--{name.replace('_', '-')} must be 0 or more, not {getattr(self, name)}"
                     for name in ("weight_decay", "warmup_steps") if not 0 <= getattr(self, name) < math.inf]
        if not 0 <= self.seed <= MAX_SEED:
            problems.append(f"--seed must be from 0 to {MAX_SEED}, not {self.seed}")
        if self.threads is not None and self.threads < 1:
            problems.append(f"--threads must be at least 1, not {self.threads}")
        if problems:
            raise UserError("; ".join(problems))
        self.model_config()  # an unknown preset or adapter fails here, before any data is made
        return self

    def conflicts(self) -> list[str]:
        """Options that are valid alone but together train a model other than the user meant (warned, not refused)."""
        if self.warmup_steps <= self.steps:  # equal: the peak at the last step (a one-step smoke run)
            return []
        reached = self.steps / self.warmup_steps  # training's learning rate at the last step, over --lr
        return [f"--warmup-steps {self.warmup_steps} is more than --steps {self.steps}: the learning rate never "
                f"reaches --lr {self.lr:g} (it ends at {reached:.1%} of it, with no cosine decay); lower "
                "--warmup-steps or raise --steps"]


def training_data_words(record: dict | None) -> str | None:
    """What a bundle's model was trained on, in words, from its training record (None: no record says)."""
    # `sdqes-edge train` fits only synthetic streams, drawn from seeds it records. The record is the bundle's,
    # someone else's data: one that says less, or says it otherwise, says nothing here.
    # The native runtime says the same of the same record (tests/vectors/training_data.json): the streams a number
    # (not a bool or a numeric string) from 0 up to MAX_RECORDED_STREAMS, which a C++ integer holds.
    try:
        train = record["data"]["train"]  # type: ignore[index]
        streams = train["streams"] if isinstance(train, dict) and "seeds" in train else None
    except (KeyError, TypeError):
        return None
    if not is_number(streams) or not 0 <= streams < MAX_RECORDED_STREAMS:  # NaN too
        return None
    return f"{SYNTHETIC_TRAINING_DATA}, {int(streams)} training streams"


def training_data_note(record: dict | None) -> str | None:
    """What `run` and `score` note of a model trained here (None: its record does not say it was); sdqes-run notes it
    word for word."""
    trained_on = training_data_words(record)
    return f"this model was trained on {trained_on} only; on other footage its alerts mean little" if trained_on \
        else None


def random_weights_words(manifest: dict) -> str | None:
    """What a bundle exported from a preset (`export --preset`: weights drawn at random, to measure speed and cost)
    says of its weights, in words; None where its manifest does not say so. `run` on such a bundle alerted at random
    with no word, though `--help` starts a user with that very export."""
    weights = manifest.get("random_weights")
    if not weights:
        return None
    if isinstance(weights, dict) and isinstance(weights.get("preset"), str) and is_whole_number(weights.get("seed")):
        return f"random weights (exported from preset {weights['preset']}, seed {weights['seed']}, to measure speed)"
    return "random weights"  # said otherwise (someone else's data): random all the same


def random_weights_warning(manifest: dict) -> str | None:
    """The warning `run`, `score` and `demo` give of a bundle whose manifest says its weights are random (None where
    it does not), as ``training_data_note`` is their note of a record; the native runtime gives it word for word."""
    words = random_weights_words(manifest)
    return None if words is None else (
        f"this bundle's model has {words}: its scores and alerts mean nothing; export a trained model to alert on "
        "(sdqes-edge export --checkpoint CHECKPOINT --out BUNDLE)")


def trained_deployment(record: dict | None) -> tuple[float | None, float | None]:
    """(the threshold calibrated on the validation streams, the frame rate it was trained at) that a training
    record gives, each None where it gives none: what an export of its checkpoint defaults to."""
    if not isinstance(record, dict):
        return None, None
    threshold, options = record.get("threshold"), record.get("options")
    fps = options.get("fps") if isinstance(options, dict) else None
    return (float(threshold) if is_number(threshold) and 0.0 < threshold < 1.0 else None,
            float(fps) if is_number(fps) and 0.0 < fps < math.inf else None)
