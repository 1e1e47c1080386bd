"""Training on synthetic streams: labels, splits, reproducibility, and a checkpoint the exporter reads."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from runtime_fixtures import another_run_writing

from sdqes_edge.checkpoints import load_model
from sdqes_edge.cli import run
from sdqes_edge.errors import UserError
from sdqes_edge.synthetic import EVENT_KINDS, PHRASINGS, Event, generate_stream
from sdqes_edge.train_options import SPLIT_SEED_SPAN, TrainOptions, is_training_seed, split_seeds
from sdqes_edge.training import frame_labels, query_catalogue, torch_scorers, train

# A run of seconds: enough to exercise every path, far too short to learn anything.
SMALL = TrainOptions(adapter="qrnn", train_streams=3, val_streams=2, test_streams=2, stream_seconds=20.0, window=8,
                     batch=2, steps=3, warmup_steps=1)


def test_the_catalogue_phrases_every_event_in_every_phrasing():
    catalogue = query_catalogue()
    assert {q.kind for q in catalogue} == set(EVENT_KINDS)
    texts = {q.text for q in catalogue}
    assert len(texts) == len(catalogue)  # no two catalogue queries read the same
    stream = generate_stream(3, seconds=30.0, fps=1.0)
    assert all(e.query in texts for e in stream.events)  # a stream's own queries are in the catalogue
    assert len(catalogue) == sum(len(p) * (1 if "lamp" in k else 5) for k, p in PHRASINGS.items())


def test_a_query_is_true_on_the_frames_of_its_event_with_the_same_colour_only():
    catalogue = query_catalogue()
    events = [Event("square_appears", 3.0, 5.0, "q", "r", "red"), Event("lamp_after_door", 8.0, 9.0, "q", "r", "")]
    labels = frame_labels(events, catalogue, frames=12, fps=1.0)
    red = [i for i, q in enumerate(catalogue) if q.kind == "square_appears" and q.colour == "red"]
    blue = [i for i, q in enumerate(catalogue) if q.kind == "square_appears" and q.colour == "blue"]
    lamp = [i for i, q in enumerate(catalogue) if q.kind == "lamp_after_door"]
    for i in red:
        assert labels[:, i].nonzero()[0].tolist() == [3, 4, 5]  # inclusive at both ends
    for i in lamp:
        assert labels[:, i].nonzero()[0].tolist() == [8, 9]
    assert labels[:, blue].sum() == 0  # a square of another colour is not the queried one
    assert labels.sum() == len(red) * 3 + len(lamp) * 2


def test_splits_draw_from_disjoint_seed_ranges_that_the_demo_avoids():
    train_, val, test = split_seeds("train", 500), split_seeds("val", 500), split_seeds("test", 500)
    assert not (set(train_) & set(val)) and not (set(train_) & set(test)) and not (set(val) & set(test))
    assert all(is_training_seed(s) for s in train_ + val + test)
    from sdqes_edge.train_options import DEMO_SEED

    assert not is_training_seed(DEMO_SEED)


@pytest.mark.parametrize("change, message", [
    (dict(window=1), "--window must be at least 2"),
    (dict(window=100), "longer than a stream"),
    (dict(steps=0), "--steps must be at least 1"),
    (dict(pos_weight=-1.0), "^--pos-weight must be positive, not -1.0$"),  # named alone, not with --lr
    (dict(adapter="lstm"), "adapter.kind 'lstm'"),
    (dict(lr=float("nan")), "^--lr must be positive, not nan$"),
    (dict(grad_clip=-1.0), "--grad-clip must be positive"),
    (dict(weight_decay=-0.1), "^--weight-decay must be 0 or more, not -0.1$"),
    (dict(warmup_steps=-5), "^--warmup-steps must be 0 or more, not -5$"),
    (dict(threads=0), "--threads must be at least 1"),
    # The command line's parsers refuse infinity; the Python API trained on it into NaN weights.
    (dict(lr=float("inf")), "^--lr must be positive, not inf$"),
    (dict(weight_decay=float("inf")), "^--weight-decay must be 0 or more, not inf$"),
    (dict(fps=0.0), r"^--fps must be positive, not 0.0$"),
    (dict(seed=-1), "--seed must be from 0 to 4294967295, not -1"),  # numpy's generator refused it in a traceback
    # The lamp started after the end of some 10-s videos: their labels held an event the frames never showed.
    (dict(stream_seconds=10.0, window=4), r"streams of 10 s at 1 fps cannot show every event.*raise --stream-seconds"),
])
def test_bad_training_options_are_refused_before_any_data_is_made(change, message):
    with pytest.raises(UserError, match=message):
        dataclasses.replace(SMALL, **change).check()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    return train(SMALL, out, log=lambda _: None), out


def test_a_run_writes_a_checkpoint_the_exporter_reads_and_a_record(small_run):
    result, out = small_run
    model, ckpt = load_model(str(result.checkpoint))
    torch.load(result.checkpoint, weights_only=True)  # plain tensors and containers: any safe loader reads it
    trained = SMALL.model_config()
    assert model.cfg.vision == trained.vision and model.cfg.text == trained.text
    # The checkpoint stores widths, not ratios: the inferred adapter has the same widths.
    a, b, width = model.cfg.adapter, trained.adapter, trained.vision.width
    assert (a.kind, a.per_block, a.lookback, a.bottleneck(width), a.qrnn_hidden(width)) == \
        (b.kind, b.per_block, b.lookback, b.bottleneck(width), b.qrnn_hidden(width))
    for key, value in result.model.clip_state_dict().items():
        torch.testing.assert_close(ckpt.state_dict[key], value, rtol=0, atol=0)
    record = json.loads((out / f"{result.checkpoint.stem}.record.json").read_text())
    assert record["command"].startswith("sdqes-edge train --adapter qrnn --seed 0")
    assert record["data"]["train"]["streams"] == 3 and record["data"]["test"]["events"] == 2 * len(EVENT_KINDS)
    assert 0.0 < record["threshold"] < 1.0 and record["pos_weight"] > 1.0
    assert set(record["test"]) >= {"all", "single_frame", "temporal", "per_kind"}


def test_the_same_seed_trains_the_same_weights_and_another_seed_does_not(small_run, tmp_path):
    first, _ = small_run
    again = train(SMALL, tmp_path / "again", log=lambda _: None)
    other = train(dataclasses.replace(SMALL, seed=1), tmp_path / "other", log=lambda _: None)
    for (key, a), b, c in zip(first.model.state_dict().items(), again.model.state_dict().values(),
                              other.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=key)
    assert any(not torch.equal(a, c) for a, c in zip(first.model.state_dict().values(),
                                                     other.model.state_dict().values()))
    assert first.record["test"] == again.record["test"]


def test_the_window_form_used_for_scoring_equals_the_step_form_the_runtime_runs(small_run):
    result, _ = small_run
    model = result.model
    frames = torch.randn(12, 3, 64, 64)
    embed_stream, _ = torch_scorers(model)
    with torch.no_grad():
        stepped, _ = model.step_frames(frames[None])
    np.testing.assert_allclose(embed_stream(frames.numpy()), stepped[0].numpy(), atol=1e-5)


def test_a_warm_up_as_long_as_the_run_is_warned_with_the_learning_rate_it_ends_at(capsys):
    """--warmup-steps 5000 with --steps 10 trained at most 0.2% of --lr and its loss did not move, with no word."""
    from sdqes_edge.cli import build_parser
    from sdqes_edge.cli.training import train_options_from_args
    from sdqes_edge.training import _learning_rate

    options = train_options_from_args(build_parser().parse_args(["train", "--warmup-steps", "5000", "--steps", "10"]))
    assert _learning_rate(options.steps - 1, options) / options.lr == pytest.approx(0.002)
    assert capsys.readouterr().err == ("sdqes-edge: warning: --warmup-steps 5000 is more than --steps 10: the learning "
                                       "rate never reaches --lr 0.002 (it ends at 0.2% of it, with no cosine decay); "
                                       "lower --warmup-steps or raise --steps\n")
    assert dataclasses.replace(options, warmup_steps=10).conflicts() == []  # the peak at the last step


def test_the_train_command_refuses_bad_options_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "train", "--window", "500", "--out",
                           str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "longer than a stream" in done.stderr
    assert not any(tmp_path.iterdir())


def small_options(options: TrainOptions = SMALL) -> list[str]:
    """The command-line options that give ``options``' streams and training (not its adapter or seed)."""
    return ["--train-streams", str(options.train_streams), "--val-streams", str(options.val_streams),
            "--test-streams", str(options.test_streams), "--stream-seconds", f"{options.stream_seconds:g}",
            "--window", str(options.window), "--batch", str(options.batch), "--steps", str(options.steps),
            "--warmup-steps", str(options.warmup_steps)]


@pytest.fixture(scope="module")
def accuracy_run(tmp_path_factory):
    """`sdqes-edge accuracy` on SMALL streams, run once for the module (about 20 s): the kinds table for the
    backbone and one temporal adapter over two seeds, and the per-format table of that adapter's first-seed model,
    which the kinds table trained. (the finished process, its results folder)"""
    out = tmp_path_factory.mktemp("accuracy")
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "accuracy", "--kinds", "none", "st",
                           "--seeds", "0", "1", "--formats", "st", *small_options(), "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done, out


def test_the_accuracy_tables_cover_kinds_seeds_and_every_deployment_format(accuracy_run):
    _, out = accuracy_run
    text = (out / "accuracy.md").read_text()
    for row in ("| none | single-frame |", "| none | temporal |", "| st | temporal |", "PyTorch (fp32)",
                "ONNX Runtime fp32", "ONNX Runtime fp16", "ONNX Runtime int8"):
        assert row in text
    report = json.loads((out / "accuracy.json").read_text())
    assert set(report["adapters"]["st"]) == {"0", "1"}
    assert f"int8 on {report['machine']['int8_instructions']}" in text  # int8's figures depend on the CPU
    formats = report["formats"]["st"]["rows"]
    # The exported graph streams what PyTorch computes; an untrained model's scores lie within 1e-3 of each
    # other, so a 1e-7 difference may still move one crossing: at most one of the 10 test queries.
    one_query = 100.0 / formats["PyTorch (fp32)"]["all"]["queries"]
    assert abs(formats["ONNX Runtime fp32"]["all"]["SR@1"] - formats["PyTorch (fp32)"]["all"]["SR@1"]) <= one_query
    assert "beat" in report["temporal_verdict"]


def test_a_precision_the_exporter_refuses_is_left_out_and_said_why(tmp_path, monkeypatch):
    """`accuracy --formats` survives a refused fp16 or int8 graph: the bundle ships the rest, the refusal is
    recorded, and the refused graph can still be made to score it."""
    from conftest import random_model

    from sdqes_edge.benchmarks.accuracy import export_formats, unshipped_graph
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.tolerances import VARIANT_TOLERANCES

    monkeypatch.setitem(VARIANT_TOLERANCES, "fp16", {"min_cosine": 1.01, "max_abs_embedding": 0.0})
    model, bundle = random_model("qrnn"), tmp_path / "qrnn" / "bundle"
    precisions, refused = export_formats(model, bundle, 0.5, SMALL, log=lambda _: None)
    assert precisions == ["fp32", "int8"] and list(refused) == ["fp16"] and "drifts beyond" in refused["fp16"]
    assert set(json.loads((bundle / "manifest.json").read_text())["graphs"]["step"]) == {"fp32", "int8"}
    # A finished export is read back, refusals included, not made again.
    assert export_formats(model, bundle, 0.5, SMALL, log=lambda _: None) == (precisions, refused)
    graph = unshipped_graph("fp16", model, bundle, SMALL)
    assert graph.parent == bundle.parent and OnnxRuntimeStep(graph).description["precision"] == "fp16"


def test_streams_that_would_not_fit_in_memory_are_refused_before_one_is_drawn(tmp_path):
    # Filling an allocation past the free memory got the process killed without a word (Linux's overcommit).
    with pytest.raises(MemoryError, match=r"20000000 frames of 128x96 need .* GiB, and .* GiB is free"):
        generate_stream(0, 1e7, 2.0)
    huge = dataclasses.replace(SMALL, train_streams=SPLIT_SEED_SPAN, stream_seconds=3600.0)
    with pytest.raises(MemoryError, match=r"streams of 3600 s at 1 fps need .* GiB"):
        train(huge, tmp_path, log=lambda _: None)


def test_the_export_printed_after_accuracy_names_a_checkpoint_the_run_wrote(accuracy_run):
    """It named runs/qrnn-seed<first>/synthetic+qrnn.pt whatever was trained: after --formats st, a file that was
    never written."""
    done, out = accuracy_run
    command = done.stdout.strip().splitlines()[-1].split()
    checkpoint = Path(command[command.index("--checkpoint") + 1])
    assert checkpoint == out / "runs" / "st-seed0" / "synthetic+st.pt" and checkpoint.is_file()


def test_a_second_training_of_the_same_model_into_its_folder_is_refused_rather_than_replacing_the_first(tmp_path):
    """Checkpoints are named for their model, not their seed: `train --seed 1` after `train --seed 0` into the
    default --out replaced the seed-0 model without a word."""
    first = tmp_path / "synthetic+qrnn.pt"
    first.write_bytes(b"the seed-0 model")
    first.with_suffix(".record.json").write_text(json.dumps({"command": "sdqes-edge train --adapter qrnn --seed 0"}))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "train", "--seed", "1", "--train-streams", "3",
                           "--val-streams", "2", "--test-streams", "2", "--stream-seconds", "20", "--window", "8",
                           "--batch", "2", "--steps", "1", "--warmup-steps", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"sdqes-edge: error: {first} exists, made by `sdqes-edge train --adapter qrnn --seed 0`; give another --out "
        f"(e.g. {tmp_path}-2) to keep it, or delete it to train that model again")
    assert first.read_bytes() == b"the seed-0 model"


def test_a_training_of_a_model_another_run_is_training_into_the_same_folder_is_refused(tmp_path):
    """Two started together each found no checkpoint, and the one that ended last replaced the other's model."""
    with another_run_writing(tmp_path, "synthetic+qrnn.pt") as first:  # as a training of synthetic+qrnn holds it
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "train", *small_options(), "--out",
                               str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"sdqes-edge: error: --out {tmp_path} is being written by another run (pid {first.pid}, sdqes-edge); stop "
        "that run, or give this one another folder")


def test_an_accuracy_run_into_a_folder_another_accuracy_run_is_writing_is_refused(tmp_path):
    """Both trained every model not yet finished in --out's runs/, wrote the same checkpoints and tables, and the one
    that ended last left its tables."""
    with another_run_writing(tmp_path, "accuracy.json") as first:  # as an accuracy run holds its --out
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "accuracy", "--kinds", "none", *small_options(),
                               "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"sdqes-edge: error: --out {tmp_path} is being written by another run (pid {first.pid}, sdqes-edge); stop "
        "that run, or give this one another folder")
    assert not (tmp_path / "runs").exists()


def test_a_dataset_written_into_a_folder_another_synth_is_writing_is_refused(tmp_path):
    """Both found the new folder empty, both said they wrote it, and the one that ended last replaced the other's."""
    with another_run_writing(tmp_path, "data") as first:  # as a synth writing tmp_path/data holds it
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "synth", "--out", str(tmp_path / "data"),
                               "--train", "1", "--val", "0", "--test", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"sdqes-edge: error: --out {tmp_path / 'data'} is being written by another run (pid {first.pid}, "
        "sdqes-edge); stop that run, or give this one another folder")


def test_a_run_whose_loss_turns_to_nan_stops_in_one_line_and_writes_no_checkpoint(tmp_path):
    """A learning rate of 1e30 made every weight NaN by the second step, and training ran to its end, wrote the NaN
    model, calibrated a NaN threshold and printed `export ... --threshold nan` as the next command."""
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "train", "--lr", "1e30", *small_options(),
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "sdqes-edge: error: training diverged: the loss became nan at step 2 of 3 (learning rate 1e+30); no "
        "checkpoint was written; lower --lr (now 1e+30) or --grad-clip (now 1)")
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("*.pt")) and "next:" not in done.stdout


def test_a_last_update_that_turns_the_weights_nan_under_a_finite_loss_writes_no_checkpoint(tmp_path, monkeypatch):
    """The loss is checked before each update; the update after the last loss is checked in the weights."""
    step = torch.optim.AdamW.step

    def poisoned(self, *args, **kwargs):  # NaN gradients, as a backward through a zero norm gives
        for group in self.param_groups:
            for parameter in group["params"]:
                parameter.grad = torch.full_like(parameter, float("nan"))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    with pytest.raises(UserError, match=r"^training diverged at its last step: the model holds NaN or infinite "
                                        r"weights in .*; no checkpoint was written; lower --lr \(now 0.002\)"):
        train(dataclasses.replace(SMALL, steps=1), tmp_path, log=lambda _: None)
    assert not list(tmp_path.glob("*.pt"))


def _stop_at_optimizer_step(monkeypatch, n: int) -> None:
    """A Ctrl-C that lands during the process's n-th optimizer step (from 1), over every model it trains."""
    step, calls = torch.optim.AdamW.step, itertools.count(1)

    def interrupted(self, *args, **kwargs):
        if next(calls) == n:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", interrupted)


def test_a_stopped_training_says_how_far_it_had_got_and_that_nothing_was_written(tmp_path, monkeypatch, capsys):
    """The progress bar is erased as a stop unwinds it: `interrupted (SIGINT)` was all that was left."""
    _stop_at_optimizer_step(monkeypatch, 3)
    assert run(["train", *small_options(), "--out", str(tmp_path / "model")]) == 130
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "sdqes-edge: note: train stopped in training synthetic+qrnn seed 0 (2 of 3); nothing was written: a model is "
        "written once it has trained to its last step and its threshold is calibrated",
        "sdqes-edge: interrupted (SIGINT)"]
    assert not list(tmp_path.rglob("*.pt"))


def test_a_stopped_accuracy_run_says_where_it_stood_and_keeps_the_runs_it_finished(tmp_path, monkeypatch, capsys):
    _stop_at_optimizer_step(monkeypatch, 5)  # the backbone's 3 steps done; the st model's second
    assert run(["accuracy", "--kinds", "none", "st", "--seeds", "0", "--formats", *small_options(), "--out",
                str(tmp_path)]) == 130
    assert capsys.readouterr().err.splitlines()[-2:] == [
        f"sdqes-edge: note: accuracy stopped in training synthetic+st seed 0 (1 of 3); the runs it finished are kept "
        f"in {tmp_path / 'runs'}, and the same command goes on from them",
        "sdqes-edge: interrupted (SIGINT)"]
    assert (tmp_path / "runs" / "none-seed0" / "synthetic.pt").is_file()
    assert not list((tmp_path / "runs" / "st-seed0").glob("*.pt"))
