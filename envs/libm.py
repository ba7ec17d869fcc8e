"""``exp`` and ``log`` for everything that draws a synthetic market or fits one: numpy's by default, the C library's
inside `reference_rounding`.

numpy computes float64 ``exp`` and ``log`` with its own AVX-512 kernels where the CPU has them (X86_V4), and with the
C library's (glibc's) everywhere else. The two differ in the last bit in a few percent of results, never by more than
1 ulp, so the same seed generates a market whose bits, and so its `envs.fingerprint.data_fingerprint`, depend on the
CPU. Inside `reference_rounding` both functions call Python's `math.exp` and `math.log` element by element: the C
library's results on any CPU, which is what numpy computes on a CPU without AVX-512. A market generated there is
the same, bit for bit, as one generated on such a CPU (`clstm_ppo.migrate.unwitnessed_market_matches` uses it for
checkpoints that record only a fingerprint). It is about 50x slower, so it is used only for that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

_REFERENCE: ContextVar[bool] = ContextVar("reference_rounding", default=False)

machine_exp: Callable[[np.ndarray], np.ndarray] = np.exp
"""numpy's ``exp`` (a module attribute, so that a test can stand in another CPU's rounding)."""
machine_log: Callable[[np.ndarray], np.ndarray] = np.log
"""numpy's ``log`` (the same)."""


def _c_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _c_log(x: float) -> float:
    if x > 0 or math.isnan(x):
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def _elementwise(function: Callable[[float], float], x: np.ndarray | float) -> np.ndarray:
    """``function`` of each element of ``x`` (any shape, as float64): the same shape; a float64 scalar for a scalar."""
    values = np.asarray(x, dtype=np.float64)
    flat = np.fromiter(map(function, values.ravel().tolist()), dtype=np.float64, count=values.size)
    return flat.reshape(values.shape)[()]


def exp(x: np.ndarray | float) -> np.ndarray:
    """``e ** x``, elementwise, as float64 (numpy's, or the C library's inside `reference_rounding`)."""
    return _elementwise(_c_exp, x) if _REFERENCE.get() else machine_exp(np.asarray(x, dtype=np.float64))


def log(x: np.ndarray | float) -> np.ndarray:
    """The natural logarithm, elementwise, as float64 (numpy's, or the C library's inside `reference_rounding`)."""
    return _elementwise(_c_log, x) if _REFERENCE.get() else machine_log(np.asarray(x, dtype=np.float64))


@contextmanager
def reference_rounding() -> Iterator[None]:
    """`exp` and `log` round as the C library does, on any CPU, inside the ``with`` block."""
    token = _REFERENCE.set(True)
    try:
        yield
    finally:
        _REFERENCE.reset(token)
