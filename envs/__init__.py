"""Market data, features and trading environments for clstm-ppo."""
