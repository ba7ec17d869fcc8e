"""A checkpoint's own data read again: which synthetic generator its source string meant, and whether a market is
the one it was trained on (a backtest of its own market, a resume).

A synthetic source string (``synthetic:tickers=5``) means the current generator (`envs.synthetic.GENERATOR_VERSION`).
A checkpoint records the version it was trained on and the data's fingerprint (`envs.sources.data_record`, in its
market spec's ``"data"``; one written before they were recorded was trained on generator 1, `clstm_ppo.migrate`).
How a record is matched to data (docs/design.md, "What is the same on another machine"): the same fingerprint; or
the recorded witness's closes within `envs.fingerprint.WITNESS_RTOL` (the same market generated on a CPU that rounds
``exp`` and ``log`` otherwise); or, for a synthetic record without a witness (0.2.x), `clstm_ppo.migrate`'s rule.
"""

from __future__ import annotations

from clstm_ppo import migrate
from clstm_ppo.market import load_data
from clstm_ppo.training.checkpoint import Checkpoint
from envs.data import MarketData
from envs.errors import UserError
from envs.fingerprint import data_fingerprint, recorded_data_matches
from envs.libm import reference_rounding
from envs.sources import is_synthetic, pin_synthetic


def own_source(ck: Checkpoint) -> str:
    """``ck``'s data source as its training read it: a synthetic source with its generator version pinned (the
    recorded one: `clstm_ppo.migrate.market_spec` records generator 1 for a file that records none); any other
    source as it is."""
    generator = (ck.market_spec.get("data") or {}).get("generator")
    return ck.cfg.data.source if generator is None else pin_synthetic(ck.cfg.data.source, generator=int(generator))


def regenerated(ck: Checkpoint) -> MarketData:
    """``ck``'s synthetic market generated again over its recorded first and last day and its tickers."""
    record = ck.market_spec.get("data") or {}
    return load_data(
        ck.cfg.data,
        seed=ck.cfg.run.seed,
        source=own_source(ck),
        start=record["first"],
        end=record["last"],
        tickers=ck.tickers,
    )


def trained_on(ck: Checkpoint, data: MarketData) -> bool:
    """Whether ``data`` is the market ``ck`` was trained on, as far as its record tells (True without a recorded
    fingerprint: nothing to compare)."""
    record = ck.market_spec.get("data") or {}
    if "fingerprint" not in record or recorded_data_matches(record, data):
        return True
    if "witness" in record or not is_synthetic(ck.cfg.data.source):
        return False

    def in_reference_rounding() -> MarketData:
        with reference_rounding():
            return regenerated(ck)

    return migrate.unwitnessed_market_matches(record, data, in_reference_rounding)


def check_regenerated(ck: Checkpoint) -> None:
    """Refuse (one `UserError`) when ``ck``'s synthetic market, generated again, is not the data it was trained on
    (`trained_on`). Nothing to check without a recorded fingerprint (an older file) or for another source: a file or
    Alpaca bars may change for good reasons, and are not regenerated."""
    record = ck.market_spec.get("data") or {}
    if "fingerprint" not in record or not is_synthetic(ck.cfg.data.source):
        return
    data = regenerated(ck)
    if not trained_on(ck, data):
        raise UserError(
            f"{ck.path}: {own_source(ck)} (seed {ck.cfg.run.seed}) no longer generates the market it was trained on "
            f"({record['first']} .. {record['last']}: fingerprint {data_fingerprint(data)}, recorded "
            f"{record['fingerprint']}); backtest it with the version of clstm-ppo that trained it"
        )
