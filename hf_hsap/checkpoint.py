"""Preemption-safe checkpoints: a completeness marker every resume checks, rotation that keeps what resume
needs, and a SIGTERM / SIGUSR1 handler on which all ranks agree once per step.

The protocol (one rule, used by ``recipes/pretrain.py``, ``recipes/sft_trl.py`` and the HSAP trainers):

1. :func:`atomic_save` on every rank: a ``checkpoint-<step>`` already there (a killed run's partial one) is
   removed first; every rank writes its files; a barrier; the main process flushes the files (``fsync``) and writes
   ``hsap_complete.json`` (to a temporary name, then ``os.replace``: the marker is there whole or not at all);
   a last barrier. A directory without the marker is *partial*: a save that was killed, that failed (a full
   disk), or that is still being written.
2. Resume: ``latest`` is :func:`latest_complete` (the highest step with a marker; partial ones are skipped and
   logged); a directory named explicitly goes through :func:`check_complete`, which refuses a partial one with a
   ``ValueError`` naming the newest complete one.
3. :func:`rotate` keeps the newest ``limit`` complete checkpoints (and ``keep``, e.g. Trainer's best one),
   deletes older complete ones and partial ones older than the newest complete one; it never deletes the
   newest complete checkpoint.
4. :class:`PreemptionHandler`: SIGTERM / SIGUSR1 (SLURM's ``--signal``) set a flag; :meth:`~PreemptionHandler.
   should_stop`, called once per step on every rank, all-reduces it (MAX) so every rank stops after the same
   step, saves and exits with :data:`PREEMPTED_EXIT_CODE`. A second signal restores the previous handlers and
   delivers the signal again (the usual way out of a save that takes too long).

No module-global state: the handler is an object, the groups are arguments (``None``: the default group).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from .log import get_logger

__all__ = ["COMPLETE_MARKER", "PREEMPTED_EXIT_CODE", "PREEMPTION_SIGNALS", "PreemptionHandler", "atomic_save",
           "check_complete", "is_complete", "latest_complete", "list_checkpoints", "mark_complete",
           "resolve_checkpoint", "rotate"]

logger = get_logger(__name__)

COMPLETE_MARKER = "hsap_complete.json"
# EX_TEMPFAIL of sysexits.h: "a temporary failure; the user is invited to retry" (a preempted job resumes)
PREEMPTED_EXIT_CODE = 75
PREEMPTION_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # Transformers' PREFIX_CHECKPOINT_DIR naming


def _barrier(group: Any = None) -> None:
    """A barrier over ``group`` (``None``: the default group); nothing without torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group=group)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The ``checkpoint-<step>`` directories of ``output_dir``, complete or not, by step (oldest first)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return sorted(found)


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a whole marker (written only after every rank finished its files)."""
    try:
        return "step" in json.loads((Path(path) / COMPLETE_MARKER).read_text())
    except (OSError, ValueError, TypeError):
        return False


def latest_complete(output_dir: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step in ``output_dir``, or ``None``; partial ones newer than it
    are logged (at WARNING: a save was killed or failed) and skipped."""
    skipped = []
    for step, path in reversed(list_checkpoints(output_dir)):
        if is_complete(path):
            if skipped:
                logger.warning("hf_hsap: skipping partial checkpoint(s) %s (no %s: the save did not finish); "
                               "resuming from %s", ", ".join(skipped), COMPLETE_MARKER, path.name)
            return path
        skipped.append(path.name)
    return None


def check_complete(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a complete checkpoint.

    Raises:
        ValueError: it does not exist or is partial; the message names the newest complete checkpoint next
            to it (or says there is none).
    """
    path = Path(path)
    if is_complete(path):
        return path
    newest = latest_complete(path.parent)
    hint = (f"the newest complete checkpoint there is {newest} (or pass --resume_from_checkpoint latest)"
            if newest is not None else f"{path.parent} holds no complete checkpoint")
    if not path.exists():
        raise ValueError(f"checkpoint {path} does not exist; {hint}")
    raise ValueError(f"checkpoint {path} is partial (no {COMPLETE_MARKER}: its save did not finish); {hint}. A "
                     "checkpoint written before hf_hsap marked them and known to be whole can be marked with "
                     "hf_hsap.checkpoint.mark_complete(path, step)")


def resolve_checkpoint(output_dir: str | os.PathLike[str], spec: str | os.PathLike[str] | bool | None) -> Path | None:
    """The checkpoint to resume from.

    Args:
        output_dir: where ``latest`` looks.
        spec: ``None`` / ``False`` / ``""`` (none), ``"latest"`` or ``True`` (:func:`latest_complete`; ``None``
            when there is none yet: a first run), or a directory (:func:`check_complete`).

    Returns:
        The checkpoint directory, or ``None``.
    """
    if not spec:
        return None
    if spec is True or spec == "latest":
        found = latest_complete(output_dir)
        if found is None:
            logger.info("hf_hsap: no complete checkpoint in %s: starting from step 0", output_dir)
        return found
    return check_complete(spec)


def mark_complete(path: str | os.PathLike[str], step: int, **info: Any) -> None:
    """Flush ``path``'s files to disk, then write its marker whole (temporary name, fsync, ``os.replace``).
    Run by one process, after every rank finished writing (:func:`atomic_save` does both)."""
    path = Path(path)
    for f in sorted(path.rglob("*")):
        if f.is_file():
            _fsync(f)
    tmp = path / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps({"step": int(step), "time": time.time(), **info}, indent=1))
    _fsync(tmp)
    os.replace(tmp, path / COMPLETE_MARKER)
    _fsync(path)


@contextmanager
def atomic_save(path: str | os.PathLike[str], step: int, *, is_main: bool, group: Any = None,
                **info: Any) -> Iterator[Path]:
    """Write a checkpoint so that it is complete (marked) only when every rank has finished its files.

    Collective over ``group``: every rank enters, writes inside the ``with`` block, and leaves after the
    marker exists. A directory of the same name is removed first (a killed run's partial one, or an older
    run's: never write into a marked directory). An exception inside the block leaves the directory partial
    (never resumed from) and is raised with a note naming it.

    Args:
        path: the ``checkpoint-<step>`` directory.
        step: the optimizer step it holds (recorded in the marker).
        is_main: whether this process writes the marker (one per job, on a shared file system).
        group: the process group of the barriers (``None``: the default group).
        **info: extra JSON fields for the marker.

    Yields:
        ``path``.
    """
    path = Path(path)
    if is_main and path.exists():  # never write into a marked directory: a kill would leave it marked and mixed
        logger.warning("hf_hsap: removing %s checkpoint %s before saving step %d into it",
                       "complete" if is_complete(path) else "partial", path, step)
        shutil.rmtree(path)
    _barrier(group)
    try:
        yield path
    except BaseException as e:
        e.add_note(f"hf_hsap: checkpoint {path} was not completed; resume skips it"
                   f" (newest complete: {latest_complete(path.parent)})")
        raise
    _barrier(group)
    if is_main:
        mark_complete(path, step, **info)
    _barrier(group)


def rotate(output_dir: str | os.PathLike[str], limit: int | None,
           keep: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Delete old checkpoints: keep the newest ``limit`` complete ones and those in ``keep``.

    Partial checkpoints older than the newest complete one are deleted too (a save that failed); newer partial
    ones are left (they may be being written). The newest complete checkpoint is never deleted. Run by one
    process, after the newest save was marked complete.

    Args:
        output_dir: the run directory.
        limit: complete checkpoints to keep (``None``: keep all, delete nothing).
        keep: paths never deleted (e.g. Trainer's best checkpoint).

    Returns:
        The deleted directories.

    Raises:
        ValueError: ``limit < 1``.
    """
    if limit is None:
        return []
    if limit < 1:
        raise ValueError(f"save_total_limit must be >= 1 (the newest complete checkpoint is always kept), got {limit}")
    found = list_checkpoints(output_dir)
    complete = [p for _, p in found if is_complete(p)]
    if not complete:
        return []
    kept = set(complete[-limit:]) | {Path(k).resolve() for k in keep}
    newest_step = max(s for s, p in found if is_complete(p))
    deleted = []
    for step, p in found:
        if p in kept or p.resolve() in kept or (step > newest_step and not is_complete(p)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        deleted.append(p)
    if deleted:
        logger.info("hf_hsap: save_total_limit %d: deleted %s", limit, ", ".join(p.name for p in deleted))
    return deleted


class PreemptionHandler:
    """SIGTERM / SIGUSR1 set a flag; :meth:`should_stop` makes every rank agree on it after the same step.

    Use as a context manager around the training loop (the previous handlers come back on exit). Handlers can
    be installed only in the main thread; elsewhere this logs a warning and never stops.

    Args:
        signals: the signals to catch (default :data:`PREEMPTION_SIGNALS`); ``()`` catches none.
    """

    def __init__(self, signals: Iterable[int] = PREEMPTION_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received: int | None = None
        self.stopped = False
        self._previous: dict[int, Any] = {}

    def install(self) -> "PreemptionHandler":
        """Install the handlers (idempotent)."""
        if self._previous:
            return self
        self.received, self.stopped = None, False
        try:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread
            self.restore()
            logger.warning("hf_hsap: not in the main thread: no preemption handler for %s", self._names())
        else:
            if self.signals:
                logger.info("hf_hsap: on %s, every rank finishes its step, saves a checkpoint and exits with %d",
                            self._names(), PREEMPTED_EXIT_CODE)
        return self

    def restore(self) -> None:
        """Put the previous handlers back."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _names(self) -> str:
        return "/".join(signal.Signals(s).name for s in self.signals) or "no signal"

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is not None:  # the second one: give up waiting, act as before this handler
            self.restore()
            os.kill(os.getpid(), signum)
            return
        self.received = signum

    def should_stop(self, group: Any = None, device: Any = "cpu") -> bool:
        """Whether any rank got a signal (collective over ``group`` when torch.distributed is initialized:
        call it on every rank at the same point of every step).

        Args:
            group: the process group (``None``: the default group, i.e. the whole job).
            device: where the one-element tensor lives (the backend's device: ``cuda`` for NCCL).

        Returns:
            True on every rank once any rank has received a signal; then :attr:`stopped` is True too.
        """
        import torch.distributed as dist

        if not self.signals:  # nothing to catch: no collective either
            return False
        flag = torch.tensor([0 if self.received is None else int(self.received)], dtype=torch.int32, device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if int(flag.item()) and not self.stopped:
            self.stopped = True
            logger.warning("hf_hsap: %s received (on this rank: %s): stopping after this step to save a checkpoint",
                           signal.Signals(int(flag.item())).name, "yes" if self.received else "no")
        return self.stopped

    def __enter__(self) -> "PreemptionHandler":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.restore()
