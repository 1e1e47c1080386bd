"""The bench results as bench.md and PNG plots (torch-free: it reads the JSON the suite measured)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sdqes_edge.benchmarks.alerting import markdown as alerting_markdown
from sdqes_edge.benchmarks.config import BACKEND_TITLES, BACKENDS
from sdqes_edge.benchmarks.device import markdown as device_markdown
from sdqes_edge.benchmarks.gpu_targets import markdown as targets_markdown
from sdqes_edge.benchmarks.machine_load import busy_machine_words
from sdqes_edge.benchmarks.retention_kernel import markdown as retention_markdown
from sdqes_edge.contract import FP32
from sdqes_edge.eval_plots import _pyplot, save_figure
from sdqes_edge.files import format_bytes


def _threads_words(results: dict) -> str:
    threads = results["config"]["threads"]
    return f"{threads} thread{'s' if threads > 1 else ''} each" if threads else "all cores each"


def markdown(results: dict) -> str:
    lines = [f"# sdqes-edge bench: {results['config']['preset']}", "",
             f"{results['machine']['cpu']}, {results['machine']['cores']} cores; torch "
             f"{results['machine']['torch']}, onnxruntime {results['machine']['onnxruntime']}; "
             f"{_threads_words(results)}. "
             f"{results['config']['repetitions']} interleaved repetitions per candidate, warm-up discarded, batch 1."]
    busy = busy_machine_words(results["machine"].get("other_processes_cores"))  # absent from older results
    lines += ["", busy] if busy else []
    if "table" in results:  # absent from a --device-only run
        lines += _cpu_sections(results)
    if "alerting" in results:  # absent from a --device-only run, and from results before December 2026
        lines += alerting_markdown(results["alerting"])
    if "device" in results:
        section = results["device"]
        lines += device_markdown(section)
        e2e = section["end_to_end"]
        lines += [f"- runtime loop on {e2e['ort_device']}: {e2e['loop_ms_per_frame']:.2f} ms/frame"
                  f"{_start_words(e2e)}; bare step {e2e['bare_step_ms_per_frame']:.2f} ms/frame; loop / step "
                  f"**{1 + e2e['overhead']:.2f}x**; the source alone (decode, sample, preprocess) "
                  f"{e2e['reader_ms_per_frame']:.2f} ms/frame; loop over the slower of the two "
                  f"**{e2e['loop_over_slower_half']:.2f}x** (1.00x: they overlap fully)"]
        lines += [f"- runtime loop on {e2e['ort_device']}, {p}: {row['loop_ms_per_frame']:.2f} ms/frame; bare {p} "
                  f"step {row['bare_step_ms_per_frame']:.2f} ms/frame; loop / step **{row['loop_over_step']:.2f}x**; "
                  f"over the slower of the step and the source **{row['loop_over_slower_half']:.2f}x**"
                  for p, row in e2e.get("by_precision", {}).items() if p != FP32]
        if "retention" in section:  # with --ort-ops: the RetNet step with the retention kernel and without
            lines += retention_markdown(section["retention"], section["device"])
        lines += targets_markdown(results)
    return "\n".join(lines) + "\n"


def _start_words(e2e: dict) -> str:
    """The loop's start, timed apart from its frames since 29 November 2026 (before, inside its ms/frame)."""
    if "loop_start_ms" not in e2e:
        return " (its start included)"
    return (f" from its first frame to its last (its start, opening the video and the first frame, "
            f"{e2e['loop_start_ms']:.1f} ms once: {e2e['loop_with_start_ms_per_frame']:.2f} ms/frame with it)")


def _cpu_sections(results: dict) -> list[str]:
    table = results["table"]
    backends = [b for b in (*BACKENDS, "trt_fp16") if any(b in r.get("latency", {}) for r in table["rows"].values())]
    head = ["model", "form", "params", "adapter params", "GMACs/frame", "GFLOPs/frame", "state/stream", "kernels/step"]
    head += [f"{BACKEND_TITLES[b]} p50/p90/p99 ms" for b in backends] + ["fps (ORT fp32)"]
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in table["rows"].items():
        cells = [name, row["form"], f"{row['parameters'] / 1e6:.2f}M", f"{row['adapter_parameters'] / 1e6:.2f}M",
                 f"{row['macs'] / 1e9:.3g}", f"{row['flops'] / 1e9:.3g}", format_bytes(row["state_bytes"]),
                 str(row.get("kernels", "-"))]
        for b in backends:
            lat = row.get("latency", {}).get(b)
            cells.append(f"{lat['p50_ms']:.1f} / {lat['p90_ms']:.1f} / {lat['p99_ms']:.1f}" if lat else "-")
        fps = row.get("latency", {}).get("ort_fp32", {}).get("fps")
        cells.append(f"{fps:.1f}" if fps else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if "trt_fp16" not in backends:
        lines += ["", "TensorRT rows: not measured (no NVIDIA GPU with TensorRT on this machine)."]
    lines += ["", "## Ratios (medians of the same interleaved run)", ""]
    lines += [f"- {k}: **{v:.2f}x**" for k, v in table["ratios"].items()]
    sc = results["scaling"]
    lines += ["", f"## Scaling with stream length ({sc['preset']}, PyTorch eager)", "",
              f"- streaming step: frames 1-{sc['probe']} {sc['streaming']['early_ms']:.2f} ms, frames "
              f"{sc['frames'] - sc['probe'] + 1}-{sc['frames']} {sc['streaming']['late_ms']:.2f} ms "
              f"(**{sc['streaming']['late_over_early']:.3f}x**); memory "
              f"{format_bytes(sc['streaming']['rss_early'])} -> "
              f"{format_bytes(sc['streaming']['rss_late'])}",
              f"- window over the whole stream so far: {sc['growing_window']['early_ms']:.1f} ms -> "
              f"{sc['growing_window']['late_ms']:.1f} ms (**{sc['growing_window']['late_over_early']:.1f}x**); "
              f"peak memory {format_bytes(sc['growing_window']['points'][0]['rss'])} -> "
              f"{format_bytes(sc['growing_window']['points'][-1]['rss'])}"]
    ba = results["batches"]
    lines += ["", f"## Several streams per step ({ba['preset']}, ORT fp32)", "",
              "| streams | step ms | streams x frames/s |", "|---|---|---|"]
    lines += [f"| {b} | {v['step_ms']:.1f} | {v['streams_fps']:.1f} |" for b, v in ba["batches"].items()]
    e2e = results["end_to_end"]
    lines += ["", f"## End to end ({e2e['preset']}, {e2e['video']})", "",
              f"- runtime loop (decode, preprocess, step, score, alert): {e2e['loop_ms_per_frame']:.1f} "
              f"ms/frame{_start_words(e2e)}; "
              f"bare step: {e2e['bare_step_ms_per_frame']:.1f} ms/frame; overhead **{100 * e2e['overhead']:.1f}%**",
              f"- the source alone (decode, sample, preprocess, in the reader thread): "
              f"{e2e['reader_ms_per_frame']:.1f} ms/frame; the loop over the slower of the source and the bare step: "
              f"**{e2e['loop_over_slower_half']:.2f}x** (1.00x: they overlap fully)",
              "- runtime loop, frames per second: " + ", ".join(
                  f"{p} **{fps:.2f}**" for p, fps in e2e["loop_fps"].items())]
    pr = results["precisions"]
    threads = pr["threads"] or f"{results['machine']['cores']} (all cores)"
    lines += ["", f"## Precisions on the CPU ({pr['preset']}, ONNX Runtime, {threads} threads)", "",
              "| step | p50 ms interleaved | p50 ms alone | over fp32 interleaved | over fp32 alone |",
              "|---|---|---|---|---|"]
    lines += [f"| {p} | {r['interleaved']['p50_ms']:.1f} | {r['alone']['p50_ms']:.1f} | "
              f"**{r['speedup_interleaved']:.2f}x** | **{r['speedup_alone']:.2f}x** |" for p, r in pr["rows"].items()]
    return lines


def plots(results: dict, out: Path) -> list[Path]:

    plt = _pyplot()
    written = []
    sc = results["scaling"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.5), dpi=100)
    ax[0].plot(np.arange(1, sc["frames"] + 1), sc["streaming"]["per_frame_ms"], lw=0.6, label="streaming step")
    pts = sc["growing_window"]["points"]
    ax[0].plot([p["frames"] for p in pts], [p["ms"] for p in pts], "o-", label="window over the stream so far")
    ax[0].set_xlabel("frame index")
    ax[0].set_ylabel("ms per frame")
    ax[0].set_yscale("log")
    ax[0].legend(fontsize=8)
    ax[0].set_title(f"latency ({sc['preset']})", fontsize=9)
    ax[1].plot([p["frames"] for p in pts], [p["rss"] / 2**20 for p in pts], "o-", color="tab:orange",
               label="window (peak)")
    ax[1].axhline(sc["streaming"]["rss_late"] / 2**20, color="tab:blue", ls="--", label="streaming (end)")
    ax[1].set_xlabel("frame index")
    ax[1].set_ylabel("process memory (MiB)")
    ax[1].legend(fontsize=8)
    ax[1].set_title("memory", fontsize=9)
    fig.tight_layout()
    written.append(save_figure(fig, out / "scaling.png"))

    rows = results["table"]["rows"]
    fig, ax = plt.subplots(figsize=(9, 3.5), dpi=100)
    names = list(rows)
    width = 0.25
    for i, backend in enumerate(BACKENDS):
        values = [rows[n].get("latency", {}).get(backend, {}).get("p50_ms", np.nan) for n in names]
        ax.bar(np.arange(len(names)) + (i - 1) * width, values, width, label=BACKEND_TITLES[backend])
    ax.set_xticks(np.arange(len(names)), names)
    ax.set_ylabel("p50 ms per frame")
    ax.set_title(f"per-frame latency, {results['config']['preset']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(save_figure(fig, out / "latency.png"))
    return written

