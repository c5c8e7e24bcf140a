"""A per-slot Python-float loop derived from a numpy kernel, so that a hot step is written once.

The serving step (:func:`services.simulator.serving.slot_step`) is written as numpy over every slot.
On a small cluster numpy's fixed cost per call (~1 µs) dominates arrays of a hundred elements, and
the same arithmetic in plain Python floats over the few occupied slots is several times faster. Two
hand-kept copies of that arithmetic would drift apart; :func:`derive_slot_loop` instead rewrites the
kernel's syntax tree into the float loop once, at import:

=================================  =============================================================
numpy (the kernel)                 Python floats (the derived loop)
=================================  =============================================================
``np.where(c, x, y)``              ``x if c else y``
``np.maximum(x, y)``               ``x if x >= y else y``
``np.minimum(x, y)``               ``x if x <= y else y``
``np.minimum.reduce([a, b, c])``   ``minimum(minimum(a, b), c)``, as above
``np.clip(x, lo, hi)``             ``lo if x < lo else (hi if x > hi else x)``
``a & b`` (boolean arrays)         ``a and b``
=================================  =============================================================

``+ - * /`` on float64 round the same way in numpy and in Python, so the loop computes the kernel's
values to the bit. Two cases the rewrite does not mirror, and a kernel must not depend on: a NaN
operand (numpy's maximum propagates it; guard divisions instead), and a tie between 0.0 and -0.0,
where the loop returns the first operand and numpy's SIMD loops the second (equal values, other bits;
the serving step's telemetry is the same bytes either way, which
``tests/unit/test_sim_core.py::test_small_cluster_step_equals_the_vectorised_step`` checks). An
operand that is not a name or a constant is evaluated once (an assignment expression), as numpy does.

The kernel's contract, checked when the loop is derived (a :class:`KernelError` names the line):

- positional parameters are per-slot values (one float or bool per slot), keyword-only ones are
  shared scalars (``dt``);
- the body is single-name assignments (``x = ...``; never ``x += ...``, which would write into the
  caller's arrays) ending in ``return`` of a tuple;
- it calls only the numpy functions above.

The derived function takes ``(columns, <name>_of..., **shared)``: ``columns`` holds one list per slot
of the first ``n_columns`` parameters, each other per-slot parameter ``<name>`` comes as one list
``<name>_of``; it returns the kernel's tuple for every slot, in order. :func:`loop_source` shows its
code.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from services.core.errors import ClusterMedicError

_NUMPY = "np"


class KernelError(ClusterMedicError):
    """A kernel uses a construct the derivation does not translate (or would translate wrongly)."""


def _is_np(node: ast.expr, *attrs: str) -> bool:
    """Whether ``node`` is ``np.<attrs[0]>.<attrs[1]>...``."""
    for attr in reversed(attrs):
        if not isinstance(node, ast.Attribute) or node.attr != attr:
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == _NUMPY


class _ToFloats(ast.NodeTransformer):
    """Rewrites one kernel expression from numpy over arrays to Python over floats."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._temps = 0

    def _temp(self, value: ast.expr) -> tuple[ast.expr, ast.expr]:
        """(first use, later uses) of ``value``: a name or constant as is, else bound once with ``:=``."""
        if isinstance(value, ast.Name | ast.Constant):
            return value, value
        self._temps += 1
        name = f"_t{self._temps}"
        return ast.NamedExpr(target=ast.Name(name, ast.Store()), value=value), ast.Name(name, ast.Load())

    def _pick(self, x: ast.expr, y: ast.expr, op: ast.cmpop) -> ast.expr:
        """``x if x <op> y else y``: maximum (``>=``) or minimum (``<=``), the first operand on a tie."""
        x_first, x_again = self._temp(x)
        y_first, y_again = self._temp(y)
        test = ast.Compare(left=x_first, ops=[op], comparators=[y_first])
        return ast.IfExp(test=test, body=x_again, orelse=y_again)

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.BitAnd):  # boolean arrays: elementwise and
            return ast.BoolOp(op=ast.And(), values=[node.left, node.right])
        if not isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            raise KernelError(f"{self._where}: operator {type(node.op).__name__} is not translated")
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if node.keywords:
            raise KernelError(f"{self._where}: keyword arguments are not translated")
        if _is_np(node.func, "minimum", "reduce"):
            (items,) = node.args
            if not isinstance(items, ast.List) or len(items.elts) < 2:
                raise KernelError(f"{self._where}: np.minimum.reduce takes a list of two or more operands")
            folded = self.visit(items.elts[0])
            for item in items.elts[1:]:
                folded = self._pick(folded, self.visit(item), ast.LtE())
            return folded
        args = [self.visit(arg) for arg in node.args]
        if _is_np(node.func, "where") and len(args) == 3:
            return ast.IfExp(test=args[0], body=args[1], orelse=args[2])
        if _is_np(node.func, "maximum") and len(args) == 2:
            return self._pick(args[0], args[1], ast.GtE())
        if _is_np(node.func, "minimum") and len(args) == 2:
            return self._pick(args[0], args[1], ast.LtE())
        if _is_np(node.func, "clip") and len(args) == 3:
            x, lo, hi = args
            if not isinstance(lo, ast.Name | ast.Constant) or not isinstance(hi, ast.Name | ast.Constant):
                raise KernelError(f"{self._where}: np.clip's bounds must be names or constants")
            first, again = self._temp(x)
            inner = ast.IfExp(test=ast.Compare(again, [ast.Gt()], [hi]), body=hi, orelse=again)
            return ast.IfExp(test=ast.Compare(first, [ast.Lt()], [lo]), body=lo, orelse=inner)
        raise KernelError(f"{self._where}: call {ast.unparse(node.func)}() is not translated")

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        raise KernelError(f"{self._where}: {ast.unparse(node)} is not translated")


def _loop_tree(kernel: Callable[..., Any], n_columns: int) -> ast.Module:
    """The syntax tree of the loop derived from ``kernel`` (see the module docstring)."""
    source = textwrap.dedent(inspect.getsource(kernel))
    func = ast.parse(source).body[0]
    if not isinstance(func, ast.FunctionDef):
        raise KernelError(f"{kernel.__qualname__} is not a plain function")
    args = func.args
    if (
        args.posonlyargs
        or args.vararg
        or args.kwarg
        or args.defaults
        or args.kw_defaults.count(None) != len(args.kw_defaults)
    ):
        raise KernelError(f"{kernel.__qualname__}: only plain positional and keyword-only parameters, no defaults")
    per_slot = [a.arg for a in args.args]
    shared = [a.arg for a in args.kwonlyargs]
    if not 0 < n_columns <= len(per_slot):
        raise KernelError(f"{kernel.__qualname__}: {n_columns} columns, but {len(per_slot)} per-slot parameters")
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstring
    *steps, last = body
    if not isinstance(last, ast.Return) or not isinstance(last.value, ast.Tuple):
        raise KernelError(f"{kernel.__qualname__}: the last statement must return a tuple")
    translated: list[ast.stmt] = []
    for step in [*steps, last]:
        where = f"{kernel.__qualname__}, line {func.lineno + step.lineno - 1}"
        if isinstance(step, ast.Return) and step is not last:
            raise KernelError(f"{where}: return only at the end")
        if isinstance(step, ast.Assign):
            if len(step.targets) != 1 or not isinstance(step.targets[0], ast.Name):
                raise KernelError(f"{where}: assign one name at a time")
            translated.append(ast.Assign(targets=step.targets, value=_ToFloats(where).visit(step.value)))
        elif step is last:
            translated.append(ast.Expr(_append("results", _ToFloats(where).visit(last.value))))
        else:
            raise KernelError(f"{where}: only 'name = expression' statements (no +=, if, for)")
    columns = ast.Tuple([ast.Name(p, ast.Store()) for p in per_slot[:n_columns]], ast.Store())
    rest = [ast.Name(p, ast.Store()) for p in per_slot[n_columns:]]
    target = ast.Tuple([columns, *rest], ast.Store()) if rest else columns
    loop = ast.For(
        target=target,
        iter=ast.Call(
            ast.Name("zip", ast.Load()),
            [ast.Name(p, ast.Load()) for p in ["columns", *(f"{q}_of" for q in per_slot[n_columns:])]],
            [ast.keyword("strict", ast.Constant(True))],
        ),
        body=translated,
        orelse=[],
    )
    derived = ast.FunctionDef(
        name=f"{func.name}_floats",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(p) for p in ["columns", *(f"{q}_of" for q in per_slot[n_columns:])]],
            kwonlyargs=[ast.arg(p) for p in shared],
            kw_defaults=[None] * len(shared),
            defaults=[],
        ),
        body=[
            ast.Assign([ast.Name("results", ast.Store())], ast.List([], ast.Load())),
            loop,
            ast.Return(ast.Name("results", ast.Load())),
        ],
        decorator_list=[],
        returns=None,
    )
    return ast.fix_missing_locations(ast.Module(body=[derived], type_ignores=[]))


def _append(name: str, value: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(name, ast.Load()), "append", ast.Load()), [value], [])


def loop_source(kernel: Callable[..., Any], n_columns: int) -> str:
    """The Python source of the loop :func:`derive_slot_loop` builds (to read it, or to debug it)."""
    return ast.unparse(_loop_tree(kernel, n_columns))


def derive_slot_loop(kernel: Callable[..., Any], n_columns: int) -> Callable[..., list[tuple[float, ...]]]:
    """Compile the Python-float loop over slots that computes what ``kernel`` computes over arrays.

    Args:
        kernel: a numpy function with the contract of the module docstring.
        n_columns: how many leading per-slot parameters come packed in each slot's column list.

    Raises:
        KernelError: the kernel uses something the derivation does not translate.
    """
    tree = _loop_tree(kernel, n_columns)
    namespace: dict[str, Any] = {}
    filename = f"<float loop derived from {kernel.__module__}.{kernel.__qualname__}>"
    exec(compile(tree, filename, "exec"), namespace)  # our own kernel's tree, rewritten above: no outside input
    derived: Callable[..., list[tuple[float, ...]]] = namespace[f"{kernel.__name__}_floats"]
    return derived
