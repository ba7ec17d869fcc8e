"""Paper (or live) trading of a checkpoint on Alpaca: `clstm-ppo trade`.

broker (the TradingClient and its errors), schedule (when a decision may be made), decision (bars -> the
backtest's own decision for one day), orders (client ids, sending, fills, re-runs), journal (trades.jsonl,
equity.csv), report (paper vs backtest), run (the command's steps in order).
"""
