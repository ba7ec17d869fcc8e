"""Market data, features and trading environments for clstm-ppo.

Importing the package registers ``envs/StockTrading-v0`` with gymnasium::

    import gymnasium, envs
    env = gymnasium.make("envs/StockTrading-v0")                       # synthetic market, train split
    env = gymnasium.make("envs/StockTrading-v0", market=prepared, split="test")
"""

import gymnasium

if "envs/StockTrading-v0" not in gymnasium.registry:
    gymnasium.register(id="envs/StockTrading-v0", entry_point="envs.trading_env:StockTradingEnv")
