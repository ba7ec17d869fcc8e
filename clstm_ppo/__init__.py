"""clstm-ppo: distributed CLSTM-PPO for stock trading (Zou et al., arXiv 2212.02721)."""

__version__ = "0.3.0"
"""This release: setup.py reads it, every checkpoint records it."""
