"""Market data, features and trading environments for clstm-ppo.

Importing the package registers ``envs/StockTrading-v0`` with gymnasium::

    import gymnasium, envs
    env = gymnasium.make("envs/StockTrading-v0")                       # synthetic market, train split
    env = gymnasium.make("envs/StockTrading-v0", market=prepared, split="test")

The main classes are importable from the package itself (``from envs import VectorStockTradingEnv``); they
load on first use, so importing ``envs.errors`` alone stays quick (no torch).
"""

from typing import Any

import gymnasium

if "envs/StockTrading-v0" not in gymnasium.registry:
    gymnasium.register(id="envs/StockTrading-v0", entry_point="envs.trading_env:StockTradingEnv")

_EXPORTS = {
    "StockTradingEnv": "envs.trading_env",
    "VectorStockTradingEnv": "envs.vector_env",
    "EnvConfig": "envs.config",
    "MarketData": "envs.data",
    "split_days": "envs.data",
    "PreparedMarket": "envs.features",
    "generate_market": "envs.synthetic",
    "load_market_data": "envs.sources",
    "UserError": "envs.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'envs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
