"""Evaluation: backtests, reports, trading metrics and the study's statistics."""
