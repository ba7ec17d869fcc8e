"""Screen a price feature without training: does a forecast from it carry more of a planted signal per trade?

    python benchmarks/vol_feature_screen.py --lag 1 --window 5 --seeds 1 2 3

For each lead-lag market draw (5 tickers, 2,520 days, strength 0.9, the learning studies' market) and each price
feature mode ("return", "vol_return"; `envs.features.price_features`, z-scored on the training days), a least-squares
map of the window's T x N features to tomorrow's feature [N] (what ``--forecaster linear`` fits) is fitted on the
first 1,690 days and applied to the later days. Printed per draw and mode: ``corr``, the held-out correlation of the
forecast with tomorrow's feature, and for each K a long-only rule holding 1/N of each stock whose forecast is above
K x its spread over the training days: annualised Sharpe after 0.1% costs (entered at the next open, kept from close
to close) and one-way turnover a year (half the summed weight changes). A screen, not a study: the rule is not the
policy, and the draws are the choice draws (spent), so it can only say which feature to take to a study.
"""

from __future__ import annotations

import argparse

import numpy as np

from envs.features import price_features
from envs.synthetic_v1 import generate_market

TRAIN_DAYS = 1690
COST = 0.001  # of the traded value
KS = (0.0, 0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5)


def screen(seed: int, lag: int, window: int, mode: str) -> tuple[float, list[tuple[float, float, float]]]:
    """``(held-out correlation, [(K, Sharpe, turnover a year)])`` of one draw and feature mode."""
    market = generate_market(num_tickers=5, num_days=2520, seed=seed, signal_strength=0.9, signal="lead_lag", lag=lag)
    close, days, n = market.close, market.close.shape[0], market.close.shape[1]
    feature, _ = price_features(close, np.zeros((days, n, 0)), mode)
    z = (feature - feature[:TRAIN_DAYS].mean(0)) / feature[:TRAIN_DAYS].std(0)
    today = np.arange(window, days - 1)  # the day each forecast is made on (after the close)
    x = np.stack([z[t - window + 1 : t + 1].ravel() for t in today])
    x = np.c_[x, np.ones(len(x))]
    y = z[today + 1]
    fit = today < TRAIN_DAYS - 1
    forecast = x @ np.linalg.lstsq(x[fit], y[fit], rcond=None)[0]  # [days, N]
    held = ~fit
    corr = float(np.corrcoef(forecast[held].ravel(), y[held].ravel())[0, 1])
    spread = forecast[fit].std()
    close_to_close, _ = price_features(close, np.zeros((days, n, 0)), "return")
    open_to_close = np.log(close / market.open)
    nxt = today[held] + 1
    rows = []
    for k in KS:
        weight = (forecast[held] > k * spread) / n  # [days, N]
        before = np.vstack([np.zeros(n), weight[:-1]])
        earned = np.where(before > 0, close_to_close[nxt], open_to_close[nxt]) * weight
        pnl = earned.sum(1) - COST * np.abs(weight - before).sum(1)
        sharpe = pnl.mean() / (pnl.std() + 1e-12) * np.sqrt(252)
        rows.append((k, float(sharpe), float(np.abs(weight - before).sum(1).mean() * 252 / 2)))
    return corr, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lag", type=int, default=1, help="1: lead-lag, 5: the memory market")
    p.add_argument("--window", type=int, default=5, help="T, days in each forecast's window")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="market draws")
    args = p.parse_args()
    for seed in args.seeds:
        for mode in ("return", "vol_return"):
            corr, rows = screen(seed, args.lag, args.window, mode)
            cells = "  ".join(f"K {k:g}: {sharpe:.2f} at {turnover:.0f}x" for k, sharpe, turnover in rows)
            print(f"draw {seed} {mode:10s} corr {corr:.3f} | {cells}")


if __name__ == "__main__":
    main()
