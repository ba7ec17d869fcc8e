"""Paper (or live) trading of a checkpoint on Alpaca: `clstm-ppo trade` (docs/trading.md lists the modules)."""
