"""The corpus scored on a Ray cluster: the same ``StreamScorer`` as the local pool, one per Ray actor.

The bundle travels once: its files go into Ray's object store (one ``ray.put``) and every actor writes them
to its own temporary folder and loads them, checked against the manifest's sha256 as any bundle is; or, with
a shared path (``shared_bundle``), every node reads the bundle where the driver does. The videos must be
visible to every node at the path the driver sees (a shared file system or a mounted bucket). Each actor
keeps one loaded detector and scores streams one after another; results stream back as they finish.

Failures: an error of the video itself (unreadable, truncated) comes back as a failed outcome, not
retried (it would fail again); a crashed worker is what Ray retries (``max_restarts``, ``max_task_retries``),
and a stream whose actor is lost for good is reported failed with Ray's reason.
"""

from __future__ import annotations

import logging
import shutil
import weakref
from pathlib import Path

from sdqes_edge.corpus import Report, StepChoice, StreamOutcome, StreamScorer, StreamTask
from sdqes_edge.errors import UserError, install_command
from sdqes_edge.files import scratch_directory
from sdqes_edge.stopping import handlers_kept

INSTALL_HINT = f"--ray needs Ray: {install_command('ray')}"
ACTOR_RESTARTS = 2  # a worker process that dies is restarted this often...
TASK_RETRIES = 2  # ...and the stream it had is tried again this often
BUNDLE_COPY_PREFIX = "sdqes-ray-bundle-"  # an actor's copy of the bundle, in its node's temp folder


def require_ray():
    try:
        import ray
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return ray


def bundle_files(bundle: Path) -> dict[str, bytes]:
    """Every file of the bundle by its path inside it (what travels through the object store)."""
    return {path.relative_to(bundle).as_posix(): path.read_bytes()
            for path in sorted(bundle.rglob("*")) if path.is_file()}


class RayScorer:
    """A Ray actor's state: one bundle, materialized once in the actor's own folder on its first stream (so
    an actor Ray restarts fetches it again), and its scorer."""

    def __init__(self, bundle: str, threads: int, quiet_opencv: bool = False, step: StepChoice = StepChoice()):
        if quiet_opencv:
            from sdqes_edge.runtime.sources import quiet_opencv_logs

            quiet_opencv_logs()
        self.bundle, self.threads, self.step = bundle, threads, step
        self.scorer: StreamScorer | None = None

    def score(self, task: StreamTask, files: list | None) -> StreamOutcome:
        """``files``: None (read the bundle where the driver does), or [an object ref of ``bundle_files``]:
        wrapped in a list, Ray passes the ref itself, fetched only by an actor that has no bundle yet."""
        if self.scorer is None:
            self.scorer = StreamScorer(self._materialize(files[0]) if files else self.bundle, self.threads,
                                       self.step)
        return self.scorer.score(task)

    def _materialize(self, ref) -> str:
        import ray

        folder = scratch_directory(BUNDLE_COPY_PREFIX)
        weakref.finalize(self, shutil.rmtree, folder, True)  # removed with the actor; if it is killed, by the next
        for name, data in ray.get(ref).items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return str(folder)


def connect(address: str | None, init_args: dict | None = None):
    """``ray.init``: ``None`` starts a local instance (or joins the one RAY_ADDRESS names), ``auto`` joins the
    running cluster, ``ray://host:10001`` connects as a client."""
    ray = require_ray()
    if not ray.is_initialized():
        try:
            with handlers_kept():  # SIGTERM stays a stop this program reports, not Ray's stack dump
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                         **(init_args or {}))
        except ConnectionError as exc:
            raise UserError(f"--ray {address}: cannot reach a Ray cluster ({str(exc).splitlines()[0]}); start one "
                            "with `ray start --head`, or give --ray without an address for a local instance") from None
    return ray


def score_on_ray(tasks: list[StreamTask], bundle: Path, threads: int, report: Report, address: str | None = None,
                 actors: int | None = None, shared_bundle: bool = False, init_args: dict | None = None,
                 quiet_opencv: bool = False, step: StepChoice = StepChoice()) -> int:
    """Stream every task through ``actors`` Ray actors (default: the cluster's CPUs / ``threads``), each
    asked for ``threads`` CPUs and stepping the ``step`` graph on them (``step`` on the CPU: Ray hides the GPUs
    from an actor that asks for none); outcomes reported as they finish. Returns the number of actors used."""
    ray = connect(address, init_args)
    files = None if shared_bundle else [ray.put(bundle_files(bundle))]  # sent once, fetched by each actor
    count = actors or max(1, int(ray.cluster_resources().get("CPU", 1) // threads))
    count = min(count, len(tasks)) or 1
    remote = ray.remote(num_cpus=threads, max_restarts=ACTOR_RESTARTS, max_task_retries=TASK_RETRIES)(RayScorer)
    pool = [remote.remote(str(bundle.resolve()), threads, quiet_opencv, step) for _ in range(count)]
    pending = list(reversed(tasks))
    running = {}
    for actor in pool:
        if pending:
            task = pending.pop()
            running[actor.score.remote(task, files)] = (actor, task)
    while running:
        done, _ = ray.wait(list(running), num_returns=1)
        actor, task = running.pop(done[0])
        try:
            report(ray.get(done[0]))
        except ray.exceptions.RayError as exc:
            report(StreamOutcome(task.stream, None, error=f"Ray gave up on it: {str(exc).strip().splitlines()[0]}"))
            if isinstance(exc, ray.exceptions.RayActorError):
                continue  # this actor is gone for good; the others take the rest
        if pending:
            task = pending.pop()
            running[actor.score.remote(task, files)] = (actor, task)
    for task in reversed(pending):  # every actor died
        report(StreamOutcome(task.stream, None, error="no Ray worker was left to score it"))
    return count
