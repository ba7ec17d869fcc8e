"""The package's layout holds: imports run one way, and no module reaches into another's private names.

Layers, lowest first (a module may import its own layer and the ones below, never above):

    0  envs                                   data, features, the trading environments
    1  clstm_ppo.config, clstm_ppo.market,    settings, settings -> prepared market, and what old files meant
       clstm_ppo.migrate
    2  clstm_ppo.agent                        the policy network, its windows, running it through a split
    3  clstm_ppo.training                     rollouts, PPO, the loop, processes, the run folder
    4  clstm_ppo.evaluation                   backtests, reports, metrics, statistics
    5  clstm_ppo.study | clstm_ppo.trading    what uses training and evaluation (never each other)
    6  clstm_ppo.cli                          flags -> the packages above

Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS: list[tuple[str, ...]] = [
    ("envs",),
    ("clstm_ppo.config", "clstm_ppo.market", "clstm_ppo.migrate"),
    ("clstm_ppo.agent",),
    ("clstm_ppo.training",),
    ("clstm_ppo.evaluation",),
    ("clstm_ppo.study", "clstm_ppo.trading"),
    ("clstm_ppo.cli",),
]
SEPARATE = {"clstm_ppo.study": "clstm_ppo.trading", "clstm_ppo.trading": "clstm_ppo.study"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str) -> str | None:
    """The layer entry (package or module) that ``module`` belongs to; None for the bare clstm_ppo package."""
    for entries in LAYERS:
        for entry in entries:
            if module == entry or module.startswith(entry + "."):
                return entry
    return None


def layer(module: str) -> int | None:
    entry = unit(module)
    return None if entry is None else next(i for i, entries in enumerate(LAYERS) if entry in entries)


def project_modules() -> dict[str, ast.Module]:
    files = [*ROOT.glob("clstm_ppo/**/*.py"), *ROOT.glob("envs/**/*.py")]
    return {module_name(p): ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in files}


def imports_of(module: str, tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """``(imported module, names taken from it, line)`` for every import in ``tree`` (relative ones resolved)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level] if not module.endswith("__init__") else module.split(".")
                base = ".".join([*package, base] if base else package)
            out.append((base, [alias.name for alias in node.names], node.lineno))
    return out


def test_imports_run_one_way() -> None:
    modules = project_modules()
    assert {"clstm_ppo.agent.model", "clstm_ppo.training.trainer", "clstm_ppo.cli.main"} <= set(modules)
    wrong = []
    for module, tree in modules.items():
        mine = layer(module)
        if mine is None:
            continue
        for target, names, line in imports_of(module, tree):
            candidates = [f"{target}.{n}" for n in names] if target == "clstm_ppo" else [target]
            for imported in candidates:
                theirs = layer(imported)
                if theirs is None:
                    continue  # third-party, stdlib, or the bare package
                if theirs > mine:
                    wrong.append(f"{module}:{line} imports {imported} (layer {theirs} above its own {mine})")
                elif SEPARATE.get(unit(module)) == unit(imported):
                    wrong.append(f"{module}:{line} imports {imported} (study and trading stay apart)")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_modules_private_names() -> None:
    modules = project_modules()
    wrong = []
    for module, tree in modules.items():
        aliases = {}
        for target, names, line in imports_of(module, tree):
            if target not in modules or target == module:
                continue
            wrong += [
                f"{module}:{line} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
            ]
        for node in ast.walk(tree):  # `import x.y as m` / `from x import y as m`, then m._private
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                wrong.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_wrong_way_import() -> None:
    """The rule itself can fail: an agent module importing training is caught."""
    tree = ast.parse("from clstm_ppo.training.checkpoint import load_checkpoint\n")
    ((target, _, _),) = imports_of("clstm_ppo.agent.model", tree)
    assert layer(target) == 3 > layer("clstm_ppo.agent.model") == 2
    assert (
        layer("envs.kernel") == 0
        and layer("clstm_ppo.cli.trade") == 6
        and unit("clstm_ppo.study.grid") == "clstm_ppo.study"
    )
