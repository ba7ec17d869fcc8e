"""The oracle's rule, as a trader runs it: the predictor recomputed from the market's closes (`envs.predictor`) and the
target portfolio it tilts toward, knowing only the rule (`planted_rule`) and the prices up to each day's close
(docs/data.md, "The oracle"). What the rule earns through the env, after costs, is
`clstm_ppo.evaluation.oracle.oracle_run`; ``clstm-ppo data oracle`` runs it on any file.
"""

from __future__ import annotations

import numpy as np

from envs.errors import UserError
from envs.predictor import SignalRule
from envs.sources import is_synthetic, parse_synthetic_options, synthetic_version

ORACLE_SCALE = 0.3
"""The oracle's action per unit of predictor: target weights ~ exp(5 x 0.3 a) = exp(1.5 a)
(`envs.kernel.target_weights`), a tilt toward the tickers the signal favours."""


def oracle_actions(predictor: np.ndarray) -> np.ndarray:
    """The oracle's actions ``[..., N]`` for ``--action_mode weights``: ``clip(ORACLE_SCALE x predictor, -1, 1)``."""
    return np.clip(ORACLE_SCALE * predictor, -1.0, 1.0)


def planted_rule(source: str) -> SignalRule | None:
    """The rule a ``synthetic:...`` source string plants its signal with, or None where it plants none that prices
    show: not synthetic, no ``signal_ic``, or generator 1 or 2 (whose predictors are hidden: `envs.synthetic_v2`)."""
    if not is_synthetic(source):
        return None
    options = source.strip().partition(":")[2]
    if synthetic_version(options) < 3:
        return None
    kwargs = parse_synthetic_options(options)
    if not float(kwargs.get("signal_ic", 0.0)) > 0:
        return None
    return SignalRule(kwargs.get("signal_kind", "lead_lag"), kwargs.get("signal_halflife", 20.0), kwargs.get("lag", 1))


def require_planted_rule(source: str) -> SignalRule:
    """`planted_rule`, or one `UserError` saying why ``source`` has no oracle."""
    rule = planted_rule(source)
    if rule is not None:
        return rule
    if not is_synthetic(source):
        raise UserError(
            f"{source!r} is not a synthetic market: name the rule to trade (e.g. --signal lead_lag,halflife=5)"
        )
    if synthetic_version(source.strip().partition(":")[2]) < 3:
        raise UserError(
            f"{source!r} is generator 1 or 2, whose planted predictor no trader can compute: it has no oracle"
        )
    raise UserError(f"{source!r} plants no signal (give signal_ic > 0)")
