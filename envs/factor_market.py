"""The factor stochastic-volatility market of synthetic generators 2 and 3: its parameters (`MarketModel`), the draw of
its daily returns and overnight gaps (`draw_factor_market`), its bars (`bars_from_parts`) and the settings of a
planted signal (`SignalSpec`, whose strength `signal_coefficient` turns into the planted move's size).

All returns are daily log returns; one ``numpy.random.Generator`` draws everything in a fixed order that does not
depend on the signal's settings. Generator 2 (`envs.synthetic_v2`, frozen for old checkpoints) and generator 3
(`envs.synthetic`) differ in their parameters and in how they plant a signal, not in this model.

Factor model -- N tickers dealt round-robin into ``S = max(1, min(5, N // 4))`` sectors; ticker i's return on day t::

    r[t, i] = mu_i + sigma_i * (sqrt(m_i) c_M[t] + sqrt(s_i) c_S[t, s(i)] + sqrt(1 - m_i - s_i - j) c_i[t])
              + sigma_i * J * B[t, i] * y[t, i] + P[t, i]

with sigma_i the daily volatility (annual ~ U(`MarketModel.annual_vol`)), mu_i = a_i / 252 - sigma_i^2 / 2 where
a_i ~ U(`MarketModel.annual_drift`) is the expected simple return a year, the variance shares m_i =
``market_share`` x U(0.6, 1.4) (market factor) and s_i = ``sector_share`` x U(0.5, 1.5) (sector), and the jump
share j = p J^2 (p = ``jump_rate`` a day, J = ``jump_size`` daily sigmas, B ~ Bernoulli(p), y ~ N(0, 1): earnings-like
idiosyncratic jumps, all in the overnight gap). ``P`` is a planted signal (the generator's; zero without one).

Each component c (the market, each sector, each ticker's own) is ``c[t] = sqrt(h[t]) z[t]``, a unit-variance
stochastic-volatility process:

* shocks ``z = n sqrt((nu - 2) / chi2_nu)``: Student-t with ``tail_dof`` degrees of freedom, scaled to variance 1;
* log variance ``x[t] = phi x[t-1] + v (rho n[t-1] + sqrt(1 - rho^2) e[t])`` (phi = ``vol_persistence``, v the
  component's vol of vol, e ~ N(0, 1)): volatility clusters, and a fall (n < 0) raises tomorrow's variance when
  rho < 0 (the leverage effect; strongest for the market, ``market_leverage``, so correlations rise in sell-offs);
  an idiosyncratic or sector log variance also loads ``common_vol`` on the market's (volatilities move together);
* ``h = exp(x - var(x) / 2)``: x is a stationary Gaussian AR(1), so E[h] = 1 exactly and sigma_i is the ticker's
  unconditional volatility. The recursion is `ar1_filter`: one step per day over all the series at once.

Bars -- close[t] = close[t-1] exp(r[t]) from a start price ~ exp(U(log 20, log 200)) dollars. The open carries the
overnight part of the day's move: each component's day is split like a Brownian bridge at ``overnight_share`` w of
its variance, ``gap = w c + sqrt(w (1 - w) h) s u`` (s the day's t scale, u ~ N(0, 1)), so gap and intraday parts
are uncorrelated, add up to the day exactly and the gap holds w of the diffusive variance, plus every jump: with the
defaults about 40% of the daily variance is overnight, as on real stocks. ``open[t] = close[t-1] exp(gap[t])``;
``high = max(open, close) exp(|N(0, (0.5 vol_t)^2)|)``, ``low = min(open, close) exp(-|...|)`` with vol_t the day's
conditional volatility; volume (whole shares) is lognormal around a per-ticker median ~ exp(U(log 3e5, log 3e7)),
times ``exp(0.25 |r| / vol_t)`` and ``exp(N(0, 0.3^2))`` noise. Dates: `business_days`; tickers: `ticker_names`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from envs import libm
from envs.data import MarketData
from envs.errors import UserError
from envs.predictor import SIGNALS, SignalRule
from envs.returns import TRADING_DAYS

TICKER_PREFIX = "SYN"  # names "SYN00", "SYN01", ...: letters then digits, unlike any listed US stock
MAX_SIGNAL_IC = 0.5
PER_TICKER: tuple[str, ...] = ("ticker_vol", "ticker_drift", "ticker_market_share")
"""`MarketModel`'s per-ticker parameters (a fitted market's)."""


def is_synthetic_ticker(name: str) -> bool:
    """Is ``name`` one the generators make (so no exchange lists it)? Also true of a CSV of generated data."""
    return re.fullmatch(rf"{TICKER_PREFIX}\d{{2,}}", name) is not None


def ticker_names(num_tickers: int) -> tuple[str, ...]:
    """ "SYN00", "SYN01", ... (zero-padded to at least two digits)."""
    width = max(2, len(str(num_tickers - 1)))
    return tuple(f"{TICKER_PREFIX}{i:0{width}d}" for i in range(num_tickers))


def whole_number(value: object, name: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; one `UserError` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < minimum:
        raise UserError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class MarketModel:
    """The factor market's parameters (module docstring). The defaults are generator 3's, calibrated to real daily US
    stocks (docs/data.md); generator 2 keeps its own (`envs.synthetic_v2.MODEL`).

    ``clstm-ppo data generate --like FILE`` (`envs.market_fit`) fits one to a user's data, with per-ticker values.
    """

    annual_vol: tuple[float, float] = (0.22, 0.45)  # range of sigma_i * sqrt(252) (fraction a year)
    annual_drift: tuple[float, float] = (0.08, 0.18)  # range of a_i, the expected simple return a year
    market_share: float = 0.30  # mean share of a ticker's variance from the market factor
    sector_share: float = 0.10  # mean share from its sector
    overnight_share: float = 0.35  # w: share of each diffusive day's variance in the overnight gap
    vol_persistence: float = 0.985  # phi: daily AR(1) coefficient of log variance (half-life ~46 days)
    # v = 0.17: var(log variance) = v^2 / (1 - phi^2) = 0.97 (generator 2's v = 0.22: 1.6), the body's weight:
    # excess kurtosis 3.2 after winsorising 0.1% per side (real stocks ~3), and the ACF(1) of |r| ~0.17. A higher
    # phi at the same var(log variance) gives no more clustering over ten-year samples (it lowers it a little).
    market_vol_of_vol: float = 0.17  # v of the market's log variance (per day)
    vol_of_vol: float = 0.17  # v of the sectors' and tickers' own log variance (per day)
    market_leverage: float = -0.7  # rho of the market: corr(today's shock, tomorrow's log-variance innovation)
    leverage: float = -0.5  # rho of the sectors and tickers
    common_vol: float = 0.4  # loading of a sector's / ticker's log variance on the market's
    tail_dof: float = 8.0  # nu of the Student-t shocks (> 2)
    # Rare large jumps carry the extreme tail (median excess kurtosis ~6, as on real stocks) and barely the body:
    # a ticker has about 2.5 in ten years, which winsorising 0.1% per side mostly removes (generator 2: 0.006 and 4.2).
    jump_rate: float = 0.001  # p: idiosyncratic jumps a day (0.001: one in four years)
    jump_size: float = 6.5  # J: a jump's standard deviation in the ticker's daily sigmas
    # Per-ticker values (a fitted market): each tuple has one number per ticker and replaces the drawn ones.
    ticker_vol: tuple[float, ...] | None = None  # annual volatility
    ticker_drift: tuple[float, ...] | None = None  # expected simple return a year
    ticker_market_share: tuple[float, ...] | None = None  # share of variance from the market factor

    def __post_init__(self) -> None:
        checks = {
            "overnight_share": 0 <= self.overnight_share < 1,
            "vol_persistence": 0 <= self.vol_persistence < 1,
            "market_leverage": -1 < self.market_leverage < 1,
            "leverage": -1 < self.leverage < 1,
            "tail_dof": self.tail_dof > 2,
            "jump_rate": 0 <= self.jump_rate < 1,
            "jump_size": self.jump_size >= 0,
            "market_share": self.market_share >= 0,
            "sector_share": self.sector_share >= 0,
            "market_vol_of_vol": self.market_vol_of_vol >= 0,
            "vol_of_vol": self.vol_of_vol >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise UserError(f"synthetic market parameters out of range: {', '.join(bad)}")
        lengths = {len(v) for name in PER_TICKER if (v := getattr(self, name)) is not None}
        if len(lengths) > 1:
            raise UserError("a fitted synthetic market needs one value per ticker in each per-ticker parameter")

    @property
    def num_fitted_tickers(self) -> int | None:
        """N of a fitted market (its per-ticker values), None when the tickers are drawn."""
        return next((len(v) for name in PER_TICKER if (v := getattr(self, name)) is not None), None)


DEFAULT_MODEL = MarketModel()
"""Generator 3's parameters."""


@dataclass(frozen=True)
class SignalSpec:
    """A planted signal: its IC, kind, half-life, overnight share and lag (`envs.synthetic.plant` and
    `envs.synthetic_v2.plant_hidden` plant it; `SignalRule` is the part a trader computes the predictor with)."""

    ic: float = 0.0  # correlation of the predictor with the return the fills earn; 0: no signal
    kind: str = "lead_lag"  # "momentum" | "lead_lag"
    halflife: float = 20.0  # days for the predictor's autocorrelation to halve
    overnight: float = 0.3  # share of the planted move in the next overnight gap (not earned by next-open fills)
    lag: int = 1  # the driving move is from day t - lag + 1 (lag >= 2: older than the day's own prices)

    def __post_init__(self) -> None:
        try:
            ic, halflife, overnight = float(self.ic), float(self.halflife), float(self.overnight)
        except (TypeError, ValueError):
            raise UserError(f"signal_ic, signal_halflife and signal_overnight must be numbers, got {self}") from None
        if not (0.0 <= ic < MAX_SIGNAL_IC):
            raise UserError(
                f"signal_ic must be in [0, {MAX_SIGNAL_IC}) (a correlation: 0.02-0.05 is realistic, 0.3 a toy), "
                f"got {self.ic!r}"
            )
        if self.kind not in SIGNALS:
            raise UserError(f"unknown synthetic signal {self.kind!r}; choose one of {', '.join(SIGNALS)}")
        if not halflife > 0:
            raise UserError(f"signal_halflife must be a positive number of days, got {self.halflife!r}")
        if not (0.0 <= overnight < 1.0):
            raise UserError(f"signal_overnight must be in [0, 1), got {self.overnight!r}")
        whole_number(self.lag, "lag", 1)
        object.__setattr__(self, "ic", ic)
        object.__setattr__(self, "halflife", halflife)
        object.__setattr__(self, "overnight", overnight)

    @property
    def persistence(self) -> float:
        """phi_a, the predictor's daily AR(1) coefficient."""
        return 0.5 ** (1.0 / self.halflife)

    @property
    def rule(self) -> SignalRule:
        """What a trader computes the predictor with (`envs.predictor`)."""
        return SignalRule(self.kind, self.halflife, self.lag)


NO_SIGNAL = SignalSpec()
"""A market without a planted signal."""


def signal_coefficient(ic: float, overnight: float, persistence: float) -> float:
    """kappa: the planted move's daily standard deviation in units of the ticker's sigma that gives the requested IC.

    With R = log(open[t+2] / open[t+1]) = (1 - o) k a[t] + o k a[t+1] + noise of variance sigma^2 (o =
    ``overnight``, phi = ``persistence``): cov(a[t], R) = kappa sigma A and var(R) = sigma^2 (1 + kappa^2 B), with
    A = (1 - o) + o phi and B = (1 - o)^2 + o^2 + 2 o (1 - o) phi, so IC = kappa A / sqrt(1 + kappa^2 B).
    """
    a = (1 - overnight) + overnight * persistence
    b = (1 - overnight) ** 2 + overnight**2 + 2 * overnight * (1 - overnight) * persistence
    if ic <= 0:
        return 0.0
    return math.sqrt(ic**2 / (a**2 - ic**2 * b))


def ar1_filter(numerator: list[float], phi: float, x: np.ndarray) -> np.ndarray:
    """``y[t] = numerator[0] x[t] + phi y[t-1]`` along axis 0 (``y[-1] = 0``), float64: bit for bit
    ``scipy.signal.lfilter(numerator, [1, -phi], x, axis=0)`` (``tests/test_synthetic_v2.py``), whose import costs
    about a second of every run on a synthetic market; a step a day over all the columns takes milliseconds."""
    y = np.empty(x.shape, dtype=np.float64)
    previous = np.zeros(x.shape[1:], dtype=np.float64)
    for t in range(x.shape[0]):
        previous = numerator[0] * x[t] + phi * previous
        y[t] = previous
    return y


def _sv_variance(n: np.ndarray, e: np.ndarray, phi: float, vol_of_vol: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """Log variance ``x [D, K]`` of K stationary AR(1) processes whose innovations are ``v (rho n[t-1] + sqrt(1 -
    rho^2) e[t])``, started from their stationary law (x[0] ~ N(0, v^2 / (1 - phi^2)))."""
    innov = np.sqrt(1 - rho**2) * e
    innov[1:] += rho * n[:-1]
    innov[0] = e[0] / math.sqrt(1 - phi**2)  # x[0] = v e[0] / sqrt(1 - phi^2): the stationary law
    return ar1_filter([1.0], phi, vol_of_vol * innov)


@dataclass(frozen=True)
class SyntheticParts:
    """The parts of a generated market's returns (module docstring). D days, N tickers; log returns a day.

    A generator draws the factor market (`draw_factor_market`: ``planted`` and ``predictor`` zero) and plants its
    signal into ``returns`` and ``gap``; the env never reads ``predictor``.
    """

    returns: np.ndarray  # [D, N] close-to-close log returns r (row 0: from the start price)
    gap: np.ndarray  # [D, N] overnight log returns log(open[t] / close[t-1])
    predictor: np.ndarray  # [D, N] a: the planted predictor known at day t's close (zeros without a signal)
    planted: np.ndarray  # [D, N] P: the planted move (log return), P[t + 1] = k a[t]
    daily_vol: np.ndarray  # [N] sigma_i, the unconditional daily volatility
    conditional_vol: np.ndarray  # [D, N] the day's conditional volatility (without the planted move)
    start_price: np.ndarray  # [N] dollars
    median_volume: np.ndarray  # [N] shares
    signal_scale: np.ndarray  # [N] k_i = kappa sigma_i (zeros without a signal)
    wicks: np.ndarray  # [2, D, N] standard normals of the high's and the low's wicks
    volume_noise: np.ndarray  # [D, N] standard normals of the volume
    own_shocks: np.ndarray  # [D, N] each ticker's idiosyncratic normal shock n_i (generator 2's signal driver)

    def with_signal(
        self, predictor: np.ndarray, planted: np.ndarray, overnight: float, scale: np.ndarray
    ) -> SyntheticParts:
        """These parts with a planted move ``planted [D, N]`` (a share ``overnight`` of it in the gap) added."""
        return replace(
            self,
            returns=self.returns + planted,
            gap=self.gap + overnight * planted,
            predictor=predictor,
            planted=planted,
            signal_scale=scale,
        )


def draw_factor_market(rng: np.random.Generator, d: int, n: int, model: MarketModel) -> SyntheticParts:
    """The factor market of ``d`` days and ``n`` tickers (module docstring), every draw from ``rng`` in a fixed order;
    no planted signal."""
    num_sectors = max(1, min(5, n // 4))
    sector = np.arange(n) % num_sectors
    k = 1 + num_sectors + n  # components: market, sectors, tickers
    # per-ticker parameters
    vol = rng.uniform(*model.annual_vol, n) / math.sqrt(TRADING_DAYS)
    drift = rng.uniform(*model.annual_drift, n) / TRADING_DAYS
    m_share = model.market_share * rng.uniform(0.6, 1.4, n)
    s_share = model.sector_share * rng.uniform(0.5, 1.5, n)
    start_price = libm.exp(rng.uniform(libm.log(20.0), libm.log(200.0), n))
    median_volume = libm.exp(rng.uniform(libm.log(3e5), libm.log(3e7), n))
    # shocks
    normal = rng.standard_normal((d, k))
    chi2 = rng.chisquare(model.tail_dof, (d, k))
    vol_news = rng.standard_normal((d, k))
    jump_day = rng.random((d, n)) < model.jump_rate
    jump = rng.standard_normal((d, n))
    bridge = rng.standard_normal((d, k))
    wicks = rng.standard_normal((2, d, n))
    volume_noise = rng.standard_normal((d, n))

    if model.ticker_vol is not None:
        vol = np.asarray(model.ticker_vol, dtype=np.float64) / math.sqrt(TRADING_DAYS)
    if model.ticker_drift is not None:
        drift = np.asarray(model.ticker_drift, dtype=np.float64) / TRADING_DAYS
    if model.ticker_market_share is not None:
        m_share, s_share = np.asarray(model.ticker_market_share, dtype=np.float64), np.zeros(n)
    jump_share = model.jump_rate * model.jump_size**2
    own_share = np.clip(1.0 - m_share - s_share - jump_share, 0.02, None)  # a variance budget left for the ticker

    # stochastic volatility: column 0 the market, then the sectors, then the tickers
    phi = model.vol_persistence
    vov = np.r_[model.market_vol_of_vol, np.full(k - 1, model.vol_of_vol)]
    rho = np.r_[model.market_leverage, np.full(k - 1, model.leverage)]
    x = _sv_variance(normal, vol_news, phi, vov, rho)
    x[:, 1:] += model.common_vol * x[:, :1]
    var_x = vov**2 / (1 - phi**2)
    var_x[1:] += model.common_vol**2 * var_x[0]  # independent Gaussian parts: variances add
    h = libm.exp(x - var_x / 2)  # [D, K], E[h] = 1
    scale = np.sqrt((model.tail_dof - 2) / chi2)  # the t shock's scale, z = n * scale
    sd = np.sqrt(h) * scale  # [D, K] the day's standard deviation of each component given its scale
    comp = sd * normal  # [D, K] unit-variance components c
    comp_gap = (
        model.overnight_share * comp + math.sqrt(model.overnight_share * (1 - model.overnight_share)) * sd * bridge
    )

    def tickers(c: np.ndarray) -> np.ndarray:
        """[D, K] component values -> [D, N] their sum in each ticker's return (daily sigmas)."""
        return (
            np.sqrt(m_share) * c[:, :1]
            + np.sqrt(s_share) * c[:, 1 + sector]
            + np.sqrt(own_share) * c[:, 1 + num_sectors :]
        )

    mu = drift - vol**2 / 2  # daily log drift of a ticker whose expected simple return is ``drift``
    jumps = vol * model.jump_size * np.where(jump_day, jump, 0.0)
    base = mu + vol * tickers(comp) + jumps
    gap = model.overnight_share * mu + vol * tickers(comp_gap) + jumps
    var_today = m_share * h[:, :1] + s_share * h[:, 1 + sector] + own_share * h[:, 1 + num_sectors :] + jump_share
    return SyntheticParts(
        returns=base,
        gap=gap,
        predictor=np.zeros((d, n)),
        planted=np.zeros((d, n)),
        daily_vol=vol,
        conditional_vol=vol * np.sqrt(var_today),
        start_price=start_price,
        median_volume=median_volume,
        signal_scale=np.zeros(n),
        wicks=wicks,
        volume_noise=volume_noise,
        own_shocks=normal[:, 1 + num_sectors :],
    )


def checked_size(num_tickers: object, num_days: object, seed: object, model: MarketModel) -> tuple[int, int, int]:
    """``(N, D, seed)`` as whole numbers (N >= 1, D >= 2, seed >= 0) that fit ``model``; one `UserError` otherwise."""
    n, d = whole_number(num_tickers, "num_tickers", 1), whole_number(num_days, "num_days", 2)
    fitted = model.num_fitted_tickers
    if fitted is not None and fitted != n:
        raise UserError(f"this fitted synthetic market has {fitted} tickers, not {n}")
    return n, d, whole_number(seed, "seed", 0)


def business_days(start: str, num_days: int) -> np.ndarray:
    """``[D]`` datetime64[ns]: ``num_days`` business days from ``start`` (on or after it); UserError for a non-date."""
    try:
        dates = pd.bdate_range(start=pd.Timestamp(start), periods=num_days)
    except (ValueError, TypeError, OverflowError):
        raise UserError(f"synthetic start date {start!r} is not a date (use YYYY-MM-DD)") from None
    return dates.to_numpy(dtype="datetime64[ns]")


def bars_from_parts(parts: SyntheticParts, dates: np.ndarray) -> MarketData:
    """The OHLCV bars of ``parts`` on ``dates`` [D] (module docstring)."""
    ret, vol = parts.returns, parts.conditional_vol
    close = parts.start_price[None, :] * libm.exp(np.cumsum(ret, axis=0))
    prev_close = np.vstack([parts.start_price[None, :], close[:-1]])
    open_ = prev_close * libm.exp(parts.gap)
    high = np.maximum(open_, close) * libm.exp(np.abs(0.5 * vol * parts.wicks[0]))
    low = np.minimum(open_, close) * libm.exp(-np.abs(0.5 * vol * parts.wicks[1]))
    volume = np.round(parts.median_volume[None, :] * libm.exp(0.25 * np.abs(ret) / vol + 0.3 * parts.volume_noise))
    return MarketData(dates, ticker_names(ret.shape[1]), open_, high, low, close, volume)
