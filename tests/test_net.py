"""`Net`, what a family's forward may call on its networks: one network and a stack of them both are one, and the
families ask for exactly its members and its layer names, so none can silently disappear or go undeclared."""

from __future__ import annotations

import inspect
from typing import Any, get_args

import pytest
import torch

from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.net import LayerName, Net, WindowLSTMName
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.agent.windows import Windows
from clstm_ppo.config import POLICIES
from tests.conftest import net_spec

STEPS, ENVS, WINDOW = 2, 4, 5
pytestmark = pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")


def tiny(policy: str, seed: int = 0) -> ActorCritic:
    """A small network of ``policy`` (3 tickers; shared's state: 1 + (2 + 3 indicators) x 3 numbers)."""
    torch.manual_seed(seed)
    features = 16 if policy == "shared" else 13
    return make_policy(net_spec(policy, features, 3, WINDOW, stage1_hidden=4, feature_dim=4, stage2_hidden=5))


def declared_members() -> set[str]:
    """The members `Net` declares: its annotated attributes and its methods."""
    methods = {name for name, value in vars(Net).items() if callable(value) and not name.startswith("_")}
    return set(Net.__annotations__) | methods


class Recording:
    """A `Net` that hands every member read to ``net``, noting the member and, for a call, the weights' name."""

    def __init__(self, net: Net) -> None:
        self._net = net
        self.members: set[str] = set()
        self.names: dict[str, set[str]] = {}  # method -> the names it was asked for

    def __getattr__(self, member: str) -> Any:
        self.members.add(member)
        value = getattr(self._net, member)
        return self._noting(member, value) if callable(value) else value

    def _noting(self, member: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(method).bind(*args, **kwargs)
            bound.apply_defaults()
            if "name" in bound.arguments:
                self.names.setdefault(member, set()).add(bound.arguments["name"])
            return method(*args, **kwargs)

        return call


def run_forward(model: ActorCritic, net: Net) -> Recording:
    """The family's forward (``forward_cells``) of ``model`` for two days of ENVS columns on ``net``, recorded."""
    spec = model.spec
    windows = Windows.from_dense(torch.randn(STEPS, ENVS, WINDOW, spec.num_features))
    starts = torch.zeros(STEPS, ENVS, dtype=torch.bool)
    starts[0] = True
    recording = Recording(net)
    mean, value, _ = type(model).forward_cells(recording, windows, model.initial_state(ENVS), starts, None)
    assert mean.shape == (STEPS, ENVS, spec.action_dim) and value.shape == (STEPS, ENVS)
    return recording


def the_nets(policy: str) -> list[tuple[ActorCritic, Net]]:
    """One network of ``policy`` on its own, and a `CellPolicy` of two, each with the network whose family it runs."""
    alone = tiny(policy)
    pair = [tiny(policy, seed) for seed in (1, 2)]
    return [(alone, alone), (pair[0], CellPolicy(pair))]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_network_and_a_stack_of_two_are_nets(policy):
    for _, net in the_nets(policy):
        assert isinstance(net, Net)
        assert all(hasattr(net, member) for member in declared_members())


def test_the_families_ask_for_exactly_what_net_declares():
    """Every member and every layer or window-LSTM name the forwards use is declared, and every declared one is used
    by some family (on one network and on a stack alike)."""
    used: set[str] = set()
    names: dict[str, set[str]] = {"layers": set(), "window_summary": set()}
    for policy in POLICIES:
        for model, net in the_nets(policy):
            recording = run_forward(model, net)
            assert recording.members <= declared_members(), policy
            used |= recording.members
            for method, asked in recording.names.items():
                names[method] |= asked
    assert declared_members() and used == declared_members()
    assert names["layers"] == set(get_args(LayerName))
    assert names["window_summary"] == set(get_args(WindowLSTMName))


@pytest.mark.parametrize("policy", ["mlp", "shared"])
def test_a_family_without_stage2_lstms_says_so_when_asked(policy):
    model = tiny(policy)
    feats = torch.zeros(1, STEPS, ENVS, model.spec.feature_dim)
    starts = torch.zeros(STEPS, ENVS, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="no stage-2 LSTMs"):
        model.stage2(feats, model.initial_state(ENVS), starts, None)
