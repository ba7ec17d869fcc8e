"""`clstm-ppo doctor`: the multi-GPU checklist in one command.

Checks torch and CUDA versions, GPUs and their memory, NCCL and gloo availability, a free
rendezvous port, a writable checkpoint folder, and whether Alpaca keys are set (by name only:
values are never printed). Exit status 0 when nothing is wrong, 1 otherwise.
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from clstm_ppo.cli.main import OneLineParser
from clstm_ppo.training.distributed import find_free_port
from envs.alpaca import KEY_VARS, SECRET_VARS


def _check(rows: list[tuple[str, str, str]], name: str, ok: bool | None, detail: str) -> None:
    rows.append(("ok" if ok else ("--" if ok is None else "FAIL"), name, detail))


def run_checks(checkpoint_dir: Path, env_file: Path) -> list[tuple[str, str, str]]:
    """Rows of (status, check, detail); status is ok, FAIL, or -- (informational)."""
    rows: list[tuple[str, str, str]] = []
    _check(rows, "python", True, platform.python_version())
    _check(rows, "torch", True, f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _check(
        rows,
        "CUDA GPUs",
        None if gpus == 0 else True,
        "none: training runs on CPU worker processes (gloo)" if gpus == 0 else f"{gpus} visible",
    )
    for i in range(gpus):
        props = torch.cuda.get_device_properties(i)
        _check(
            rows,
            f"  cuda:{i}",
            True,
            f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
            f"compute {props.major}.{props.minor}{' (TF32/bf16)' if props.major >= 8 else ''}",
        )
    _check(rows, "gloo backend", dist.is_available() and dist.is_gloo_available(), "CPU workers")
    nccl = dist.is_available() and dist.is_nccl_available()
    _check(
        rows,
        "NCCL backend",
        nccl if gpus else None,
        (
            f"version {'.'.join(map(str, torch.cuda.nccl.version()))}"
            if nccl and gpus
            else ("available" if nccl else "not in this torch build")
        ),
    )
    try:
        port = int(os.environ.get("MASTER_PORT") or 0) or find_free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
        _check(
            rows,
            "rendezvous port",
            True,
            f"{port} free on 127.0.0.1" + (" (MASTER_PORT)" if os.environ.get("MASTER_PORT") else ""),
        )
    except OSError as err:
        _check(rows, "rendezvous port", False, f"MASTER_PORT={os.environ.get('MASTER_PORT')} in use: {err.strerror}")
    try:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        probe = checkpoint_dir / f".doctor-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        _check(rows, "checkpoint folder", True, f"{checkpoint_dir} writable")
    except OSError as err:
        _check(rows, "checkpoint folder", False, f"{checkpoint_dir}: {err.strerror or err}")
    file_values = {}
    if env_file.is_file():
        from dotenv import dotenv_values

        file_values = dotenv_values(env_file)
        _check(rows, ".env file", True, f"{env_file} found")
    else:
        _check(rows, ".env file", None, f"{env_file} absent (copy .env.example to use Alpaca)")
    # The same rule as envs.alpaca.load_credentials: the first key variable set and the first secret variable set.
    key = next((name for name in KEY_VARS if os.environ.get(name) or file_values.get(name)), None)
    secret = next((name for name in SECRET_VARS if os.environ.get(name) or file_values.get(name)), None)
    _check(
        rows,
        "Alpaca keys",
        True if key and secret else None,
        f"{key} and {secret} set (values not shown)"
        if key and secret
        else "not set: needed only for --data alpaca (ALPACA_API_KEY and ALPACA_SECRET_KEY)",
    )
    return rows


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="clstm-ppo doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint_dir", default="checkpoints", help="folder training will write to")
    parser.add_argument("--env_file", default=".env", help="the .env file holding Alpaca keys")
    args = parser.parse_args(argv)
    rows = run_checks(Path(args.checkpoint_dir), Path(args.env_file))
    width = max(len(name) for _, name, _ in rows)
    for status, name, detail in rows:
        print(f"[{status:>4}] {name:<{width}}  {detail}")
    failed = [name for status, name, _ in rows if status == "FAIL"]
    print(f"\n{'all checks passed' if not failed else 'problems: ' + ', '.join(failed)}")
    return 1 if failed else 0
