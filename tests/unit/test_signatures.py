"""No function or method of ``hf_hsap`` takes more than :data:`MAX_POSITIONAL` positional parameters.

What counts (read off the source with :mod:`ast`, every module of the package, nested functions and lambdas too):
positional-only and positional-or-keyword parameters, except a method's leading ``self`` or ``cls`` (the first
parameter of a function defined directly in a class body). Not counted: ``*args`` (no named positional),
keyword-only parameters (after ``*`` or ``*args``; unlimited) and ``**kwargs``. An ``autograd.Function``'s
``ctx`` is an ordinary parameter here (autograd passes no keywords: its non-tensor arguments travel as one object).
"""
from __future__ import annotations

import ast
import pathlib

import hf_hsap

PACKAGE = pathlib.Path(hf_hsap.__file__).parent
ROOT = PACKAGE.parent
MAX_POSITIONAL = 6
RECEIVERS = ("self", "cls")

Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def positional_names(node: Function, in_class: bool) -> list[str]:
    """The positional parameters of ``node`` that count (module docstring); ``in_class``: defined directly in a
    class body."""
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if in_class and names and names[0] in RECEIVERS:
        names = names[1:]
    return names


def _functions(tree: ast.AST) -> list[tuple[Function, bool]]:
    """Every function and lambda of ``tree``, with whether it is defined directly in a class body."""
    out = []
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                out.append((child, isinstance(parent, ast.ClassDef)))
    return out


def offenders(source: str, path: str) -> list[str]:
    """``path:line name: n positional (names)`` for every function of ``source`` over :data:`MAX_POSITIONAL`, in
    line order."""
    out = []
    for node, in_class in _functions(ast.parse(source)):
        names = positional_names(node, in_class)
        if len(names) > MAX_POSITIONAL:
            name = getattr(node, "name", "<lambda>")
            out.append((node.lineno, f"{path}:{node.lineno} {name}: {len(names)} positional ({', '.join(names)})"))
    return [line for _, line in sorted(out)]


def test_the_count_leaves_out_receivers_star_args_and_keyword_only_parameters() -> None:
    source = (
        "class A:\n"
        "    def m(self, a, b, c, d, e, f, *args, g, **kw): ...\n"
        "    @classmethod\n"
        "    def c(cls, a, b, c, d, e, f, g): ...\n"
        "    @staticmethod\n"
        "    def forward(ctx, a, b, c, d, e, f): ...\n"
        "def top(self, a, b, c, d, e, f): ...\n"
        "def posonly(a, b, c, /, d, e, f, *, g, h): ...\n"
        "f = lambda a, b, c, d, e, f, g: 0\n"
    )
    found = offenders(source, "x.py")
    # m: 6 besides self (*args, g and **kw left out); posonly: 6 (g, h keyword-only)
    assert found == ["x.py:4 c: 7 positional (a, b, c, d, e, f, g)",
                     "x.py:6 forward: 7 positional (ctx, a, b, c, d, e, f)",
                     "x.py:7 top: 7 positional (self, a, b, c, d, e, f)",
                     "x.py:9 <lambda>: 7 positional (a, b, c, d, e, f, g)"]


def test_no_function_takes_more_than_six_positional_parameters() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50  # the whole package is read
    found = []
    for path in modules:
        found += offenders(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, (
        f"{len(found)} function(s) of hf_hsap take more than {MAX_POSITIONAL} positional parameters (self / cls not "
        "counted); take the rest keyword-only (after `*`), or pass a group that travels together as one object:\n  "
        + "\n  ".join(found))
