"""What identifies a market data set for the trials ledger and the sealed hold-out.

Two facts about loaded `envs.data.MarketData`, both independent of where it came from (a synthetic spec, a CSV, a
Parquet file, Alpaca) and of the order of its tickers:

* `data_fingerprint`: a hash of exactly what was loaded (tickers, dates, every open/high/low/close/volume as
  float64 bits). The same file loaded twice, or the same data written to CSV by pandas and read back (pandas
  writes floats in their shortest round-trip form), give the same fingerprint; one more day, one ticker less,
  or one price changed give another.
* `market_witness`: the close of every ticker on the first trading day of each calendar month in the data. Two
  loads of the same market over different date ranges (the file extended by a later download, or read from a
  later start) share the witness days in their overlap and agree on them, where their fingerprints differ. A
  seal (`clstm_ppo.evaluation.holdout`) and the trials ledger (`clstm_ppo.evaluation.ledger`) recognise "the same
  market" by the witness, ticker by ticker: synthetic markets all name their tickers SYN00, SYN01, ... so the
  names alone would confuse one synthetic draw with every other.

Size: a witness holds ``months x tickers`` floats (20 tickers over 7 years: 1,680 numbers, about 30 kB of JSON).
"""

from __future__ import annotations

from envs.fingerprint import WITNESS_RTOL as WITNESS_RTOL  # where they live: envs (checkpoints record them)
from envs.fingerprint import agreeing_tickers as agreeing_tickers
from envs.fingerprint import data_fingerprint as data_fingerprint
from envs.fingerprint import market_witness as market_witness
