"""A checkpoint's own data read again: which synthetic generator its source string meant, and whether the market
generated again is the one it was trained on.

A synthetic source string (``synthetic:tickers=5``) means the current generator (`envs.synthetic.GENERATOR_VERSION`).
A checkpoint records the version it was trained on and the data's fingerprint (`envs.sources.data_record`, in its
market spec's ``"data"``; one written before they were recorded was trained on generator 1, `clstm_ppo.migrate`).
"""

from __future__ import annotations

from clstm_ppo.market import load_data
from clstm_ppo.training.checkpoint import Checkpoint
from envs.errors import UserError
from envs.fingerprint import data_fingerprint, recorded_data_matches
from envs.sources import is_synthetic, pin_synthetic


def own_source(ck: Checkpoint) -> str:
    """``ck``'s data source as its training read it: a synthetic source with its generator version pinned (the
    recorded one: `clstm_ppo.migrate.market_spec` records generator 1 for a file that records none); any other
    source as it is."""
    generator = (ck.market_spec.get("data") or {}).get("generator")
    return ck.cfg.data.source if generator is None else pin_synthetic(ck.cfg.data.source, generator=int(generator))


def check_regenerated(ck: Checkpoint) -> None:
    """Refuse (one `UserError`) when ``ck``'s synthetic market, generated again over its recorded first and last day
    and tickers, is not the data it was trained on (`recorded_data_matches`: another fingerprint, and no recorded
    witness that the closes agree up to float rounding). Nothing to check without a recorded fingerprint (an older
    file) or for another source: a file or Alpaca bars may change for good reasons, and are not regenerated."""
    record = ck.market_spec.get("data") or {}
    if "fingerprint" not in record or not is_synthetic(ck.cfg.data.source):
        return
    source = own_source(ck)
    data = load_data(
        ck.cfg.data, seed=ck.cfg.run.seed, source=source, start=record["first"], end=record["last"], tickers=ck.tickers
    )
    if not recorded_data_matches(record, data):
        raise UserError(
            f"{ck.path}: {source} (seed {ck.cfg.run.seed}) no longer generates the market it was trained on "
            f"({record['first']} .. {record['last']}: fingerprint {data_fingerprint(data)}, recorded "
            f"{record['fingerprint']}); backtest it with the version of clstm-ppo that trained it"
        )
