"""The synthetic generators' ``exp`` and ``log`` (`envs.libm`): numpy's by default, the C library's inside
`reference_rounding`, which is what numpy computes on a CPU without AVX-512 and what migrate's rule for a
checkpoint without a witness (`clstm_ppo.migrate.unwitnessed_market_matches`) generates a market in."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np

from envs import libm
from envs.fingerprint import data_fingerprint
from envs.libm import reference_rounding
from envs.sources import load_market_data
from tests.conftest import ROOT

SOURCES = (
    "synthetic:tickers=4,days=400,generator=1",
    "synthetic:tickers=5,days=300,generator=2,signal_ic=0.2",
    "synthetic:tickers=6,days=600,signal_ic=0.3,signal_kind=lead_lag,signal_halflife=5",
    "synthetic:tickers=8,days=500,signal_ic=0.1,signal_kind=momentum",
)
"""One market of each generator, with and without a planted signal of each kind."""
WITHOUT_AVX512 = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}
"""numpy's AVX-512 kernels off: its ``exp`` and ``log`` are the C library's, as on any CPU without AVX-512."""


def test_the_reference_rounding_gives_the_bits_numpy_gives_without_avx512():
    """On an AVX-512 CPU this checks that the reference covers every ``exp`` and ``log`` the generators call (the
    markets' fingerprints equal those of a process whose numpy has its AVX-512 kernels off); on any other CPU both
    sides are the C library's."""
    script = (
        "import json, sys; from envs.sources import load_market_data; from envs.fingerprint import data_fingerprint; "
        "print(json.dumps([data_fingerprint(load_market_data(s, seed=7)) for s in sys.argv[1:]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *SOURCES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **WITHOUT_AVX512},
        check=True,
    )
    with reference_rounding():
        assert [data_fingerprint(load_market_data(s, seed=7)) for s in SOURCES] == json.loads(done.stdout)


def test_the_reference_is_the_c_librarys_function_and_numpys_within_one_ulp():
    """Element by element `math.exp` and `math.log`, at the edges too (overflow to inf, log of 0 and of a negative
    number as numpy gives them); numpy's own kernels within 1 ulp of them."""
    x = np.random.default_rng(0).normal(0.0, 3.0, 10_000)
    with reference_rounding():
        exp, log = libm.exp(x), libm.log(np.abs(x))
        edges = libm.exp(np.array([800.0, -800.0, np.nan])), libm.log(np.array([0.0, -1.0, np.inf]))
        assert isinstance(libm.log(20.0), float)
    assert exp.tolist() == [math.exp(v) for v in x] and log.tolist() == [math.log(abs(v)) for v in x]
    np.testing.assert_array_equal(edges[0], [np.inf, 0.0, np.nan])
    np.testing.assert_array_equal(edges[1], [-np.inf, np.nan, np.inf])
    assert np.all(np.abs(libm.exp(x) - exp) <= np.spacing(exp)) and np.all(
        np.abs(libm.log(np.abs(x)) - log) <= np.spacing(np.abs(log))
    )
    assert not libm._REFERENCE.get()  # only inside the block


def test_another_cpus_rounding_moves_a_markets_bits_and_not_its_prices(another_cpus_rounding):
    """What `tests.conftest.nudged` stands in for: the fingerprint changes, every price stays within 1e-12 of itself."""
    source = SOURCES[2]
    with reference_rounding():
        reference = load_market_data(source, seed=7)
    here = load_market_data(source, seed=7)
    assert data_fingerprint(here) != data_fingerprint(reference)
    np.testing.assert_allclose(here.close, reference.close, rtol=1e-12, atol=0)
