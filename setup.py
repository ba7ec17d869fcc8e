"""Packaging for clstm-ppo: `pip install -e .` (users) or `pip install -e .[dev]` (tests)."""

import re
from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")
VERSION = re.search(
    r'__version__ = "([^"]+)"', Path(__file__).with_name("clstm_ppo").joinpath("__init__.py").read_text()
)

setup(
    name="clstm-ppo",
    version=VERSION.group(1),  # clstm_ppo.__version__, the one place it is written
    description="Distributed CLSTM-PPO stock-trading trainer (Zou et al., arXiv 2212.02721) with honest backtests",
    long_description=README.read_text(encoding="utf-8") if README.exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["clstm_ppo", "clstm_ppo.*", "envs", "envs.*"]),
    py_modules=["train_distributed_clstm_ppo"],
    install_requires=[
        "torch>=2.2",
        "gymnasium>=1.0",
        "numpy>=1.24",
        "pandas>=2.0",
        "scipy>=1.10",  # envs.facts' moments, envs.market_fit's root finding, the study statistics' t quantiles
        "alpaca-py>=0.30",
        "python-dotenv>=1.0",
        "pyarrow>=14",
        "matplotlib>=3.7",
        "tqdm>=4.60",
    ],
    extras_require={
        "dev": [
            "pytest>=7.4",
            "pytest-timeout>=2.2",
            "pytest-xdist>=3.5",  # the suite on two workers, one test file each (pyproject.toml's addopts)
            "ruff>=0.5",
            "hypothesis>=6.90",
            "ta>=0.11",
            "empyrical-reloaded>=0.5.10",
            "tensorboard>=2.14",
            "wandb>=0.16",  # tests/test_tracking.py runs --track wandb offline
            "ray>=2.60",  # tests/test_study_ray.py runs a study on a two-node Ray cluster on 127.0.0.1
        ],
        "tensorboard": ["tensorboard>=2.14"],
        "wandb": ["wandb>=0.16"],
        "ray": ["ray>=2.60"],  # clstm-ppo study --ray ADDRESS
        "bench": ["stable-baselines3>=2.3", "sb3-contrib>=2.3"],
    },
    entry_points={"console_scripts": ["clstm-ppo=clstm_ppo.cli:main"]},
)
