"""Names that moved: one module ``__getattr__`` factory for the one-release deprecation aliases.

A moved name keeps working for one release: reading it warns (``FutureWarning``, pointing at the caller)
and returns the object from its new module. The new module is imported when the old name is read
(``importlib``), so an alias never adds a static import edge (a low layer may alias a name that now
lives above it; the import contract stays true for real code).
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping

__all__ = ["moved_names"]


def moved_names(module: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for names that moved.

    Args:
        module: the old module's ``__name__``.
        names: old name -> (new module, why it moved: a short phrase, may be empty).

    Returns:
        The ``__getattr__`` function to assign in the old module.
    """
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, why = names[name]
        warnings.warn(f"{module}.{name} moved to {new}.{name}{f' ({why})' if why else ''}; the old name will be "
                      "removed in the next release", FutureWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
