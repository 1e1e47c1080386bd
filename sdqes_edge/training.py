"""Training a small SDQES model on synthetic event streams: the paper's recipe at small scale, on a CPU.

The recipe (DESIGN.md section 1): a dual encoder scores every frame against a
query with ``cos(frame, query)`` and is trained with binary cross-entropy on
that cosine (no temperature) against dense per-frame labels, over windows of
``w`` frames sampled at 1 fps, with a positive-class weight because a query is
true on few frames. No pretrained CLIP can be downloaded here, so the whole
dual encoder (the ``synthetic`` preset) is trained from scratch together with
its adapters, from one seed.

Data: streams from ``synthetic.generate_stream``, split by stream (train,
validation, test draw seeds from disjoint ranges). Each window is scored
against every query the generator can phrase (every event kind, colour and
phrasing); a query is true on a frame when the window's stream has that event,
of that colour, and the frame lies in the event's interval. The threshold is
calibrated on validation streams only; test streams are scored once, at the end.
"""

from __future__ import annotations

import io
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import __version__
from .checkpoints import refuse_non_finite_weights
from .config import ModelConfig
from .errors import UserError
from .evaluation import calibrate_thresholds
from .files import make_folders, replaced_atomically, write_text_atomically
from .metrics import EvalResult, ScoreTrace, evaluate
from .sample import check_fits_in_memory, preprocessed_bytes
from .synthetic import COLOURS, PHRASINGS, Event, generate_stream
from .tokenizer import default_tokenizer
from .train_options import CHECKPOINT_RECORD_KEY, TrainOptions, split_seeds

# --- queries ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CatalogueQuery:
    kind: str
    colour: str  # "" for events without a colour (the lamp)
    text: str


def query_catalogue() -> list[CatalogueQuery]:
    """Every query the generator can phrase: each event kind x colour x phrasing."""
    out = []
    for kind, phrasings in PHRASINGS.items():
        colours = list(COLOURS) if any("{colour}" in q for q, _ in phrasings) else [""]
        for colour in colours:
            for query, _ in phrasings:
                out.append(CatalogueQuery(kind, colour, query.format(colour=colour)))
    return out


def frame_labels(events: list[Event], catalogue: list[CatalogueQuery], frames: int, fps: float) -> np.ndarray:
    """[T, Q] float32: 1 where the stream has the query's event (kind and colour) and the frame is inside it."""
    times = np.arange(frames) / fps
    labels = np.zeros((frames, len(catalogue)), dtype=np.float32)
    for q, query in enumerate(catalogue):
        for e in events:
            if e.kind == query.kind and e.colour == query.colour:
                labels[(times >= e.start_time - 1e-9) & (times <= e.end_time + 1e-9), q] = 1.0
    return labels


# --- data -----------------------------------------------------------------------------------

@dataclass
class StreamSet:
    """One split's streams, preprocessed as the runtime preprocesses camera frames."""

    uids: list[str]
    frames: torch.Tensor  # [N, T, 3, R, R] float32, normalized
    events: list[list[Event]]
    labels: torch.Tensor  # [N, T, Q] against the query catalogue
    fps: float

    @property
    def size(self) -> int:
        return len(self.uids)


def make_split(split: str, count: int, options: TrainOptions, cfg: ModelConfig,
               catalogue: list[CatalogueQuery], progress: Callable | None = None) -> StreamSet:
    from sdqes_edge.runtime.preprocess import Preprocessor  # numpy only: the runtime's own preprocessing

    prep = Preprocessor.from_config(cfg)
    uids, frames, events, labels = [], [], [], []
    seeds = split_seeds(split, count)
    for seed in (progress(seeds, desc=f"{split} streams") if progress else seeds):
        stream = generate_stream(seed, options.stream_seconds, options.fps)
        uids.append(stream.uid)
        frames.append(prep.batch(stream.frames))
        events.append(stream.events)
        labels.append(frame_labels(stream.events, catalogue, len(stream.frames), options.fps))
    return StreamSet(uids, torch.from_numpy(np.stack(frames)), events, torch.from_numpy(np.stack(labels)),
                     options.fps)


# --- scoring and metrics --------------------------------------------------------------------

@dataclass
class SplitScores:
    traces: list[ScoreTrace]  # one per annotated event, with the stream's own phrasing of the query
    kinds: list[str]
    temporal: list[bool]


def score_split(streams: StreamSet, embed_stream: Callable[[np.ndarray], np.ndarray],
                encode_queries: Callable[[list[str]], np.ndarray]) -> SplitScores:
    """Score every annotated event of every stream. ``embed_stream``: frames [T,3,R,R] -> [T,E], state carried."""
    from sdqes_edge.runtime.queries import score  # numpy only
    out = SplitScores([], [], [])
    for i, uid in enumerate(streams.uids):
        events = streams.events[i]
        emb = embed_stream(streams.frames[i].numpy())
        queries = encode_queries([e.query for e in events])
        _, probs = score(emb, queries)  # [T, events]: the runtime's own p = sigmoid(cos)
        for j, e in enumerate(events):
            out.traces.append(ScoreTrace(probs[:, j], e.start_time, streams.fps, 0.0, f"{uid}/{e.kind}"))
            out.kinds.append(e.kind)
            out.temporal.append(e.temporal)
    return out


def torch_scorers(model) -> tuple[Callable, Callable]:
    """PyTorch embedders for ``score_split``: the window form over the whole stream (equal to the step form)."""

    @torch.no_grad()
    def embed_stream(frames: np.ndarray) -> np.ndarray:
        return model.visual.forward_clip(torch.from_numpy(frames)[None])[0].numpy()

    @torch.no_grad()
    def encode_queries(texts: list[str]) -> np.ndarray:
        return model.encode_text(texts).numpy()

    return embed_stream, encode_queries


@dataclass
class SplitMetrics:
    """SR/SMD on one split at one threshold: all events, single-frame events, temporal events."""

    threshold: float
    all: EvalResult
    single_frame: EvalResult
    temporal: EvalResult
    per_kind: dict[str, EvalResult] = field(default_factory=dict)

    def headline(self, result: EvalResult) -> dict[str, float]:
        return {"SR@1": result.recall["[-5,+10]"][1], "SR@3": result.recall["[-5,+10]"][3],
                "SMD@1": result.min_distance[1], "queries": result.queries}

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "all": self.headline(self.all),
                "single_frame": self.headline(self.single_frame), "temporal": self.headline(self.temporal),
                "per_kind": {k: self.headline(r) for k, r in self.per_kind.items()}}


def split_metrics(scores: SplitScores, threshold: float) -> SplitMetrics:
    def subset(keep) -> list[ScoreTrace]:
        return [t for t, k in zip(scores.traces, keep) if k]

    return SplitMetrics(
        threshold,
        evaluate(scores.traces, threshold),
        evaluate(subset([not t for t in scores.temporal]), threshold),
        evaluate(subset(scores.temporal), threshold),
        {kind: evaluate(subset([k == kind for k in scores.kinds]), threshold) for kind in sorted(set(scores.kinds))},
    )


def calibrated_threshold(val_scores: SplitScores) -> float:
    """The paper's rule on validation streams only: the candidate with the best SR@1."""
    return calibrate_thresholds(val_scores.traces, val_scores.kinds, per_label=False).threshold


# --- training -------------------------------------------------------------------------------

def balanced_pos_weight(labels: torch.Tensor) -> float:
    positives = float(labels.sum())
    return (labels.numel() - positives) / max(positives, 1.0)


def _learning_rate(step: int, options: TrainOptions) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < options.warmup_steps:
        return options.lr * (step + 1) / options.warmup_steps
    progress = (step - options.warmup_steps) / max(1, options.steps - options.warmup_steps)
    return options.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass
class TrainResult:
    checkpoint: Path
    record: dict
    model: torch.nn.Module


def build_model(options: TrainOptions):
    from .model.sdqes_model import SDQESModel

    torch.manual_seed(options.seed)
    return SDQESModel(options.model_config())


def train(options: TrainOptions, out_dir: str | Path, log: Callable[[str], None] = print,
          progress: Callable | None = None, data: dict[str, StreamSet] | None = None) -> TrainResult:
    """Train one model, calibrate on validation, score the test split; write ``<name>.pt`` and ``record.json``.

    ``data`` lets several runs (adapters, seeds) share the splits they would each generate identically.
    """
    options.check()
    out_dir = Path(out_dir)
    make_folders(out_dir)
    started = time.perf_counter()
    if options.threads:
        torch.set_num_threads(options.threads)
    catalogue = query_catalogue()
    cfg = options.model_config()
    data = data or make_splits(options, cfg, catalogue, progress)
    data_seconds = time.perf_counter() - started

    model = build_model(options)
    token_ids = torch.from_numpy(default_tokenizer(cfg.text.context_length).tokenize([q.text for q in catalogue]))
    pos_weight = torch.tensor(options.pos_weight or balanced_pos_weight(data["train"].labels))
    losses = _fit(model, options, data["train"], token_ids, pos_weight, progress)
    # A last update of NaN gradients under a finite loss (which _fit checks) would be saved as the model.
    refuse_non_finite_weights(model.state_dict(), "training diverged at its last step: the model",
                              _lower_the_pace(options))
    train_seconds = time.perf_counter() - started - data_seconds

    embed_stream, encode_queries = torch_scorers(model)
    val_scores = score_split(data["val"], embed_stream, encode_queries)
    threshold = calibrated_threshold(val_scores)
    val = split_metrics(val_scores, threshold)
    test = split_metrics(score_split(data["test"], embed_stream, encode_queries), threshold)
    record = {
        "command": training_command(options),
        "options": asdict(options),
        "model": json.loads(cfg.to_json()),
        "data": {split: {"streams": s.size, "frames": int(s.frames.shape[0] * s.frames.shape[1]),
                         "events": sum(len(e) for e in s.events), "seeds": [split_seeds(split, s.size)[0],
                                                                            split_seeds(split, s.size)[-1]]}
                 for split, s in data.items()},
        "catalogue_queries": len(catalogue),
        "pos_weight": float(pos_weight),
        "loss": {"first_20": float(np.mean(losses[:20])), "last_20": float(np.mean(losses[-20:]))},
        "threshold": threshold,
        "val": val.to_dict(),
        "test": test.to_dict(),
        "seconds": {"data": round(data_seconds, 1), "training": round(train_seconds, 1),
                    "total": round(time.perf_counter() - started, 1)},
        "versions": {__package__: __version__, "torch": str(torch.__version__), "numpy": np.__version__,
                     "python": platform.python_version()},
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    checkpoint = _save(model, record, out_dir / f"{cfg.name}.pt")
    log(f"{cfg.name} seed {options.seed}: loss {record['loss']['first_20']:.4f} -> {record['loss']['last_20']:.4f}, "
        f"threshold {threshold:.4f} (validation), test SR@1 all {test.headline(test.all)['SR@1']:.1f} / "
        f"single-frame {test.headline(test.single_frame)['SR@1']:.1f} / temporal "
        f"{test.headline(test.temporal)['SR@1']:.1f}, {record['seconds']['total']:.0f} s")
    return TrainResult(checkpoint, record, model)


def _save(model, record: dict, checkpoint: Path) -> Path:
    """``<name>.pt`` (weights in CLIP's layout, with the record) and ``<name>.record.json``, each written whole."""
    # Serialized in memory and written by Python: torch's own writer, refused by a full disk, raised a RuntimeError
    # ("enforce fail at inline_container.cc: unexpected pos") where the disk's refusal is an OSError that says so.
    serialized = io.BytesIO()
    torch.save({"state_dict": model.clip_state_dict(), CHECKPOINT_RECORD_KEY: record}, serialized)
    with replaced_atomically(checkpoint) as partial:
        partial.write_bytes(serialized.getbuffer())
    write_text_atomically(checkpoint.parent / f"{checkpoint.stem}.record.json", json.dumps(record, indent=2))
    return checkpoint


def _fit(model, options: TrainOptions, train_set: StreamSet, token_ids: torch.Tensor, pos_weight: torch.Tensor,
         progress: Callable | None) -> list[float]:
    """AdamW on BCE of cos(frame, query) over random windows of the training streams; the loss per step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=options.weight_decay)
    rng = np.random.default_rng(options.seed)
    frames_per_stream = train_set.frames.shape[1]
    losses = []
    steps = range(options.steps)
    bar = progress(steps, desc=f"training {model.cfg.name} seed {options.seed}") if progress else steps
    model.train()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, options)
        streams = rng.choice(train_set.size, size=min(options.batch, train_set.size), replace=False)
        offsets = rng.integers(0, frames_per_stream - options.window + 1, size=len(streams))
        index = torch.as_tensor(offsets)[:, None] + torch.arange(options.window)[None]  # [B, w]
        rows = torch.as_tensor(streams)[:, None]
        frames = train_set.frames[rows, index]  # [B, w, 3, R, R]
        labels = train_set.labels[rows, index]  # [B, w, Q]
        frame_emb = model.visual.forward_clip(frames)  # [B, w, E]
        query_emb = model.text(token_ids)  # [Q, E]
        cosine = frame_emb @ query_emb.T  # [B, w, Q]: the logits, no temperature
        loss = torch.nn.functional.binary_cross_entropy_with_logits(cosine, labels, pos_weight=pos_weight)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):  # the weights are lost: every later step, and the checkpoint, is NaN
            raise UserError(_divergence(step, losses[-1], options))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), options.grad_clip)
        optimizer.step()
        if hasattr(bar, "set_postfix") and step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
    model.eval()
    return losses


def _divergence(step: int, loss: float, options: TrainOptions) -> str:
    """Why training stopped at ``step`` (0-based), with the options that set its pace."""
    return (f"training diverged: the loss became {loss} at step {step + 1} of {options.steps} (learning rate "
            f"{_learning_rate(step, options):g}); {_lower_the_pace(options)}")


def _lower_the_pace(options: TrainOptions) -> str:
    return f"no checkpoint was written; lower --lr (now {options.lr:g}) or --grad-clip (now {options.grad_clip:g})"


def make_splits(options: TrainOptions, cfg: ModelConfig, catalogue: list[CatalogueQuery],
                progress: Callable | None = None) -> dict[str, StreamSet]:
    sizes = {"train": options.train_streams, "val": options.val_streams, "test": options.test_streams}
    # Every split is held preprocessed, and each is stacked once more as it is made.
    per_stream = int(round(options.stream_seconds * options.fps))
    check_fits_in_memory(preprocessed_bytes(per_stream * (sum(sizes.values()) + max(sizes.values())),
                                            cfg.vision.image_size),
                         f"{sum(sizes.values())} streams of {options.stream_seconds:g} s at {options.fps:g} fps")
    return {split: make_split(split, n, options, cfg, catalogue, progress) for split, n in sizes.items()}


def training_command(options: TrainOptions) -> str:
    """The complete command line that reproduces ``options``: every option spelled out, so that it still
    reproduces the run after a default changes."""
    parts = ["sdqes-edge train"]
    for key, value in asdict(options).items():
        if value is not None:
            parts.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


__all__ = ["TrainOptions", "train", "make_splits", "query_catalogue", "frame_labels", "score_split", "split_metrics",
           "calibrated_threshold", "torch_scorers"]
