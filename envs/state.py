"""The choices and defaults that shape the data and a day's state vector, in one light module (no numpy, pandas
or torch to import), so the command line can offer them and `--help` stays fast. The state's layout itself is
`StateLayout` below (and documented on `envs.vector_env.VectorStockTradingEnv`).
"""

from __future__ import annotations

MAX_PRICE_RATIO = 10.0
"""A close more than this many times the previous close, or less than its 1/this, is refused as a bad tick
(a split-unadjusted 1:10 reverse split is the largest honest jump we know of; 0 turns the check off)."""

PRICE_MODES = ("level", "return")
"""The price column of the state: "level" (the close, as in the paper and FinRL) or "return" (the day's log
return, with MACD divided by the close): see `envs.features.price_features`."""

DEFAULT_PRICE_MODE = "return"
"""The price column unless a run says otherwise (training's --price_features default too): the daily log
return stays in the training range out of sample, where price levels drift away from it."""

INDICATORS: tuple[str, ...] = ("macd", "rsi", "cci", "adx")
"""The technical indicators a state can carry (all by default, FinRL's set; conventions in envs.features)."""

COLUMN_PREFIX = "col:"
"""``--indicators col:NAME`` puts the data file's own numeric column NAME into each day's state as one more indicator
(docs/data.md, "Feature columns"): a forecast, a factor, a sentiment score."""


def column_of(name: str) -> str | None:
    """The file column a state indicator name reads (``"col:alpha"`` -> ``"alpha"``), None for a built-in one."""
    return name[len(COLUMN_PREFIX) :] if name.startswith(COLUMN_PREFIX) else None


def indicator_name_problem(names: tuple[str, ...]) -> str | None:
    """Why ``names`` (``--indicators``, parsed) is not a valid indicator list, or None: each a distinct built-in
    indicator or ``col:NAME`` with a NAME."""
    for name in names:
        column = column_of(name)
        if column is None and name not in INDICATORS:
            return f"unknown indicator {name!r}"
        if column is not None and not column.strip():
            return f"{name!r} names no column (give col:NAME)"
    repeated = sorted({n for n in names if names.count(n) > 1})
    return f"{', '.join(repeated)} given twice" if repeated else None


PORTFOLIO_FEATURES = ("shares", "weights")
"""How cash and holdings enter the state: "shares" (cash / initial amount and shares / HOLDINGS_SCALE, as in
the paper) or "weights" (cash and each holding's value as fractions of the portfolio value)."""

HOLDINGS_SCALE = 1000.0
"""Shares are divided by this in the observation: 1.0 = 1,000 shares (10 full-size orders at hmax = 100)."""

ACTION_MODES = ("shares", "weights")
"""What an action in [-1, 1]^N means: "shares" (the paper's: buy or sell up to hmax shares per stock per day) or
"weights" (the target portfolio: softmax over the N stocks' logits 5 a_i and a cash logit 0, reached by trading)."""

REWARDS = ("value", "log_return")
"""The reward: "value" (the change of portfolio value in dollars x reward_scaling, the paper's) or "log_return"
(100 x the day's log return of the portfolio: a 1% day is about 1.0, whatever the portfolio's size)."""


class StateLayout:
    """Where each number sits in one day's state of N tickers and K indicators: ``F = 1 + N + N + K x N`` columns,
    column 0 cash, then blocks of N, one column per ticker: ``prices``, ``holdings`` and each of the K ``indicators``
    (`envs.vector_env`'s module docstring says what each column holds)."""

    def __init__(self, num_tickers: int, num_indicators: int) -> None:
        self.num_tickers, self.num_indicators = num_tickers, num_indicators

    @classmethod
    def of_width(cls, num_features: int, num_tickers: int) -> StateLayout:
        """The layout of states F numbers wide for N tickers; ValueError when F is not 1 + blocks of N."""
        blocks, rest = divmod(num_features - 1, num_tickers)
        if rest or blocks < 2:
            raise ValueError(f"a state of {num_features} numbers is not 1 + blocks of {num_tickers} tickers")
        return cls(num_tickers, blocks - 2)

    @property
    def num_features(self) -> int:
        return 1 + (2 + self.num_indicators) * self.num_tickers

    @property
    def prices(self) -> slice:
        return slice(1, 1 + self.num_tickers)

    @property
    def holdings(self) -> slice:
        return slice(1 + self.num_tickers, 1 + 2 * self.num_tickers)

    @property
    def indicators(self) -> slice:
        return slice(1 + 2 * self.num_tickers, self.num_features)


EXECUTIONS = ("auto", "close", "next_open", "next_close")
"""When an order decided on day t's close fills: "close" (at that very close, the paper's and FinRL's), "next_open"
(day t+1's open: what trading after the close gets), "next_close" (day t+1's close), or "auto": next_open where the
data has opens, next_close on close-only data (`envs.execution.resolve_execution`)."""
