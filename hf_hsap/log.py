"""hf_hsap's loggers: one hierarchy under ``"hf_hsap"``, decisions quiet unless the application asks.

The library adds no handler and sets no level. Without any logging configuration Python prints only
WARNING and above (its last-resort handler on stderr), so hf_hsap's fallbacks that change what runs are
seen and its decisions (DEBUG / INFO) are not. An application shows the decisions with ordinary logging,
e.g. ``logging.basicConfig(level=logging.INFO)``, or ``logging.basicConfig()`` plus
``logging.getLogger("hf_hsap").setLevel(logging.DEBUG)``. (No ``NullHandler``: it would silence those
warnings too.)

Levels used by hf_hsap:

* ``DEBUG``: decisions taken per case (which layout branch an attention call took, what a collator cut), each
  distinct case once per process (:func:`log_once`), never once per layer or step;
* ``INFO``: set-up decisions (the kernel chosen, a model check skipped, data skipped on resume);
* ``WARNING``: fallbacks that change what runs and are otherwise silent (batches dropped, masks missing).
"""
from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

__all__ = ["ROOT_LOGGER", "forget_logged", "get_logger", "log_once"]

ROOT_LOGGER = "hf_hsap"

_root = logging.getLogger(ROOT_LOGGER)



def get_logger(name: str | None = None) -> logging.Logger:
    """A logger in the ``"hf_hsap"`` hierarchy.

    Args:
        name: a module's ``__name__`` (``"hf_hsap.integrations.trainer"``), a suffix (``"data"`` ->
            ``"hf_hsap.data"``), or ``None`` / ``"hf_hsap"`` for the root of the hierarchy.

    Returns:
        The :class:`logging.Logger`; it propagates to ``"hf_hsap"`` and from there to the root logger.
    """
    if not name or name == ROOT_LOGGER:
        return _root
    if not name.startswith(ROOT_LOGGER + "."):
        name = f"{ROOT_LOGGER}.{name}"
    return logging.getLogger(name)


def log_once(logger: logging.Logger, level: int, key: Hashable, msg: str, *args: Any) -> bool:
    """Log ``msg % args`` the first time ``key`` is seen by ``logger`` while ``level`` is enabled.

    For decisions taken in hot paths (every attention layer, every batch): the check is one cached
    ``isEnabledFor`` when the level is off, and one set lookup when it is on. A key seen while the level was
    off is not remembered, so turning logging on later still shows every case once.

    Args:
        logger: where to log.
        level: a :mod:`logging` level.
        key: what makes a case distinct (hashable, e.g. a tuple of strings).
        msg, args: the message, formatted lazily as by :meth:`logging.Logger.log`.

    Returns:
        Whether the message was logged now.
    """
    if not logger.isEnabledFor(level):
        return False
    seen = _seen(logger)
    if key in seen:
        return False
    seen.add(key)
    logger.log(level, msg, *args, stacklevel=2)
    return True


def _seen(logger: logging.Logger) -> set:
    """The keys :func:`log_once` already logged on ``logger``, kept on the logger object itself. That is
    process-wide state (loggers are, by the logging module's design), bounded by the distinct cases; hf_hsap
    keeps no registry of its own."""
    seen = getattr(logger, "_hsap_logged", None)
    if seen is None:
        seen = set()
        logger._hsap_logged = seen  # type: ignore[attr-defined]
    return seen


def forget_logged() -> None:
    """Forget the cases :func:`log_once` logged on every hf_hsap logger, so each is logged again (for tests)."""
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if (name == ROOT_LOGGER or name.startswith(ROOT_LOGGER + ".")) and isinstance(lg, logging.Logger):
            getattr(lg, "_hsap_logged", set()).clear()
