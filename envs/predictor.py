"""A planted signal's predictor, computed as a trader computes it: from the daily closes up to day t and nothing else.

Generator 3 (`envs.synthetic`) plants its signal with this filter while it draws each day, and the reference trader
(`envs.oracle`, ``clstm-ppo data oracle``) runs the same filter over a market's closes (a generated one, or any file),
so the predictor the market was built around and the one a trader recomputes from the written file are the same up to
float rounding.

On day t, with r[t, i] = log(close[t, i] / close[t-1, i]) (day 0 has no return: the predictor is 0 there):

1. Standardise by a trailing volatility: ``z[t, i] = r[t, i] / s[t, i]`` with ``s[t]^2`` the exponentially weighted
   mean of r^2 over days 1..t (half-life `VOL_HALFLIFE` days, weights normalised to sum to 1, today included: a jump
   is at most about 5 trailing sigmas).
2. The driver ``d[t, i]``, from the standardised returns of day t - lag + 1 (zero until ``lag`` returns are known),
   each relative to the mean of others, so that the market's own moves, which every ticker shares, drive nothing:
   ``"momentum"``: the ticker's own z minus the mean z of the other tickers; ``"lead_lag"``: in pairs, for odd i
   (ticker 1 follows ticker 0, ticker 3 ticker 2, ...) the leader's z minus the mean z of the other leaders (the
   even tickers), and 0 for the leaders themselves, which follow none: their returns carry no planted move, so their
   followers' drivers are white. (With one ticker, or one leader, there is no other to compare with: the z itself.)
3. An exponential average of the driver, ``u[t] = phi u[t-1] + sqrt(1 - phi^2) d[t]`` (phi = 0.5^(1 / halflife)):
   of unit variance when d is white with unit variance.
4. Kept at unit variance by its own trailing root mean square: ``a[t] = u[t] / q[t]``, ``q[t]^2 = lambda q[t-1]^2 +
   (1 - lambda) u[t]^2`` (half-life `SCALE_HALFLIFE` days) from ``q^2 = 1`` before day 1. Under momentum a ticker's
   returns carry its own planted move, so d is persistent and u wider than 1; q brings it back, so the signal's
   strength means the same on every ticker.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from envs import libm
from envs.errors import UserError

SIGNALS: tuple[str, ...] = ("momentum", "lead_lag")
VOL_HALFLIFE = 20.0
"""Days of the trailing volatility that standardises each day's return (step 1)."""
SCALE_HALFLIFE = 250.0
"""Days of the trailing root mean square that keeps the predictor at unit variance (step 4)."""
_TINY = 1e-300  # a variance floor: a ticker whose returns have all been 0 so far gives z = 0, not 0 / 0


@dataclass(frozen=True)
class SignalRule:
    """How the predictor is computed from prices (module docstring): the kind, the half-life in days, the lag."""

    kind: str = "lead_lag"
    halflife: float = 20.0
    lag: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SIGNALS:
            raise UserError(f"unknown signal {self.kind!r}; choose one of {', '.join(SIGNALS)}")
        try:
            halflife = float(self.halflife)
        except (TypeError, ValueError):
            halflife = math.nan
        if not halflife > 0 or math.isinf(halflife):
            raise UserError(f"a signal's half-life must be a positive number of days, got {self.halflife!r}")
        if isinstance(self.lag, bool) or not isinstance(self.lag, int | np.integer) or self.lag < 1:
            raise UserError(f"a signal's lag must be a whole number of days >= 1, got {self.lag!r}")
        object.__setattr__(self, "halflife", halflife)
        object.__setattr__(self, "lag", int(self.lag))

    @property
    def persistence(self) -> float:
        """phi, the daily coefficient of the average (step 3)."""
        return 0.5 ** (1.0 / self.halflife)

    @classmethod
    def parse(cls, text: str) -> SignalRule:
        """``"lead_lag"``, ``"momentum,halflife=5"``, ``"lead_lag,halflife=5,lag=2"`` -> the rule; one `UserError`
        naming what is wrong otherwise."""
        kind, *options = [part.strip() for part in str(text).split(",")]
        values: dict[str, str] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key.strip() not in ("halflife", "lag") or not value.strip():
                raise UserError(f"signal option {option!r}: give halflife=DAYS or lag=DAYS (e.g. lead_lag,halflife=5)")
            values[key.strip()] = value.strip()
        try:
            halflife = float(values.get("halflife", cls.halflife))
            lag = int(values.get("lag", cls.lag))
        except ValueError:
            raise UserError(f"signal {text!r}: halflife must be a number of days and lag a whole number") from None
        return cls(kind, halflife, lag)

    def describe(self) -> str:
        """``lead_lag (half-life 5 days)``, with the lag where it is not 1."""
        lag = "" if self.lag == 1 else f", lag {self.lag} days"
        return f"{self.kind} (half-life {self.halflife:g} days{lag})"


class PredictorFilter:
    """The predictor of N tickers one day at a time (module docstring): ``step(r)`` takes day t's log returns ``[...,
    N]`` (t = 1, 2, ...; leading dimensions: several markets at once, each on its own) and gives ``a[t]`` of the same
    shape. The generator steps it as it draws each day; `predictor_from_prices` steps it over a file's closes."""

    def __init__(self, rule: SignalRule, shape: int | tuple[int, ...]) -> None:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.rule = rule
        self.vol_decay = 0.5 ** (1.0 / VOL_HALFLIFE)
        self.scale_decay = 0.5 ** (1.0 / SCALE_HALFLIFE)
        self.phi = rule.persistence
        self.gain = math.sqrt(1.0 - self.phi * self.phi)
        self.square_mean = np.zeros(shape)  # unnormalised EWMA of r^2
        self.weight = 0.0  # the sum of its weights
        self.recent: deque[np.ndarray] = deque(maxlen=rule.lag)  # z of the last `lag` days, oldest first
        self.average = np.zeros(shape)  # u
        self.scale_square = np.ones(shape)  # q^2
        self.driver = np.zeros(shape)
        n = shape[-1] if rule.kind == "momentum" else (shape[-1] + 1) // 2  # tickers in the relative mean
        self.others = 1.0 / (n - 1) if n > 1 else 0.0

    def step(self, r: np.ndarray) -> np.ndarray:
        """``a[t]`` ``[..., N]`` from day t's log returns ``r`` ``[..., N]``."""
        square = self.square_mean
        square *= self.vol_decay
        square += (1.0 - self.vol_decay) * (r * r)
        self.weight = self.vol_decay * self.weight + (1.0 - self.vol_decay)
        z = r / np.sqrt(np.maximum(square * (1.0 / self.weight), _TINY))  # 0 where no return has moved yet
        self.recent.append(z)
        driver = self.driver
        if len(self.recent) == self.rule.lag:
            z = self.recent[0]
            if self.rule.kind == "momentum":
                np.subtract(z, (z.sum(axis=-1, keepdims=True) - z) * self.others, out=driver)
            else:
                leaders = z[..., 0::2]
                followers = driver[..., 1::2]
                relative = leaders - (leaders.sum(axis=-1, keepdims=True) - leaders) * self.others
                followers[:] = relative[..., : followers.shape[-1]]
        average = self.average
        average *= self.phi
        average += self.gain * driver
        scale = self.scale_square
        scale *= self.scale_decay
        scale += (1.0 - self.scale_decay) * (average * average)
        return average / np.sqrt(np.maximum(scale, _TINY))


def predictor_from_prices(close: np.ndarray, rule: SignalRule) -> np.ndarray:
    """``[D, N]`` the predictor ``a[t, i]`` of daily closes ``close [D, N]`` (dollars, > 0): row t reads rows 0..t
    only (module docstring)."""
    close = np.asarray(close, dtype=np.float64)
    returns = np.diff(libm.log(close), axis=0)
    out = np.zeros(close.shape)
    predictor = PredictorFilter(rule, close.shape[1])
    for t in range(1, close.shape[0]):
        out[t] = predictor.step(returns[t - 1])
    return out


def fill_returns(open_: np.ndarray | None, close: np.ndarray) -> np.ndarray:
    """``[D, N]`` the log return an order decided at day t's close earns over the next day at the backtest's fills:
    ``log(open[t+2] / open[t+1])`` at next-open fills (data with opens), ``log(close[t+2] / close[t+1])`` at next-close
    fills (``open_`` None: close-only data); NaN in the last two rows."""
    prices = np.asarray(close if open_ is None else open_, dtype=np.float64)
    out = np.full(prices.shape, np.nan)
    out[:-2] = libm.log(prices[2:] / prices[1:-1])
    return out


def information_coefficient(predictor: np.ndarray, ahead: np.ndarray) -> float:
    """The mean over tickers of the correlation over days t of ``predictor[t]`` ``[D, N]`` with ``ahead[t]``
    (`fill_returns`): the IC a planted signal is set by. Tickers whose predictor never moves (a lead-lag pair's
    leader) are left out, and so are days where ``ahead`` is NaN. NaN when no ticker has a predictor."""
    rows = ~np.isnan(ahead).any(axis=1)
    a = predictor[rows] - predictor[rows].mean(axis=0)
    r = ahead[rows] - ahead[rows].mean(axis=0)
    moving = (a * a).sum(axis=0) > 0
    if not moving.any():
        return math.nan
    a, r = a[:, moving], r[:, moving]
    return float(((a * r).sum(axis=0) / np.sqrt((a * a).sum(axis=0) * (r * r).sum(axis=0))).mean())
