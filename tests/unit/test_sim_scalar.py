"""The float loop derived from a numpy kernel computes the kernel's bits, and refuses what it cannot translate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from services.simulator import serving
from services.simulator.scalar import KernelError, derive_slot_loop, loop_source


def toy(a: np.ndarray, b: np.ndarray, flag: np.ndarray, *, k: float) -> tuple[np.ndarray, ...]:
    """Every construct the derivation translates, on operands that tie, cross zero and need guards."""
    lo = np.minimum(a, b)
    hi = np.maximum(a * k, b - 1.0)
    folded = np.minimum.reduce([a, b, a * b, b / np.maximum(a, 0.5)])
    clipped = np.clip((a - b) / 3.0, 0.0, 1.0)
    picked = np.where(flag & (a > b), a / np.maximum(b, 1e-9), 0.0)
    return lo, hi, folded, clipped, picked


def operands(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.round(rng.normal(0.0, 2.0, n), 1) + 0.0  # rounded: many ties between a and b; + 0.0: no -0.0
    b = np.round(rng.normal(0.0, 2.0, n), 1) + 0.0
    a[:20] = 0.0
    b[10:30] = 0.0
    return a, b, rng.random(n) < 0.5


def test_the_derived_loop_gives_numpys_bits() -> None:
    a, b, flag = operands(np.random.default_rng(7), 400)
    want = np.array(toy(a, b, flag, k=1.5)).T
    loop = derive_slot_loop(toy, n_columns=2)
    got = np.array(loop(np.array([a, b]).T.tolist(), flag.tolist(), k=1.5))
    assert got.tobytes() == want.tobytes()  # to the bit, ties included
    assert "np." not in loop_source(toy, 2)


def test_signed_zeros_compare_equal_whichever_operand_is_taken() -> None:
    # numpy's SIMD maximum(0.0, -0.0) returns -0.0, the loop the first operand: equal values, other bits
    a, b, flag = operands(np.random.default_rng(8), 400)
    a[20:25] = b[30:40] = -0.0
    want = np.array(toy(a, b, flag, k=1.5)).T
    got = np.array(derive_slot_loop(toy, n_columns=2)(np.array([a, b]).T.tolist(), flag.tolist(), k=1.5))
    assert (got == want).all()


def test_the_serving_step_has_one_written_form() -> None:
    source = loop_source(serving.slot_step, len(serving._STEP_ROWS) + len(serving._INPUT_ROWS))
    assert "np." not in source and source.count("results.append(") == 1


def augmented(a: np.ndarray) -> tuple[np.ndarray]:
    a += 1.0  # would write into the caller's row
    return (a,)


def exp_call(a: np.ndarray) -> tuple[np.ndarray]:
    b = np.exp(a)
    return (b,)


def branching(a: np.ndarray) -> tuple[np.ndarray]:
    if a.any():
        a = a * 2.0
    return (a,)


@pytest.mark.parametrize(
    ("kernel", "message"),
    [(augmented, "only 'name = expression'"), (exp_call, r"np\.exp\(\) is not translated"), (branching, "only 'name")],
)
def test_an_untranslatable_kernel_is_refused_with_its_line(kernel: Callable[..., Any], message: str) -> None:
    with pytest.raises(KernelError, match=message) as info:
        derive_slot_loop(kernel, n_columns=1)
    assert "line " in str(info.value)
