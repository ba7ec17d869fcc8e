"""``--policy clstm``, the paper's cascaded LSTM (Zou et al. 2022, section 3).

Stage 1 runs an LSTM (F -> ``stage1_hidden``) over each observation's T-day window and maps its last output through two
tanh layers to ``feature_dim`` features (``window_kernel`` picks how the window LSTM is computed:
`clstm_ppo.agent.window_lstm`). Stage 2 is `clstm_ppo.agent.lstm`'s: separate actor and critic LSTMs (``stage2_hidden``,
one layer) across days over those features, a linear head for the Gaussian's means and one for the value.
"""

from __future__ import annotations

from torch import Tensor, nn

from clstm_ppo.agent.layers import orthogonal
from clstm_ppo.agent.lstm import LSTMPolicy
from clstm_ppo.agent.net import Net
from clstm_ppo.agent.windows import Windows


class CLSTMPolicy(LSTMPolicy):
    """The window LSTM in front of `LSTMPolicy`'s tanh layers (see the module docstring)."""

    def _build_stage1(self) -> None:
        self.window_lstm = orthogonal(nn.LSTM(self.spec.num_features, self.spec.stage1_hidden, batch_first=True), 1.0)

    def _stage1_width(self) -> int:
        return self.spec.stage1_hidden

    @classmethod
    def encode(cls, net: Net, windows: Windows) -> Tensor:
        return net.layers("features", net.window_summary(windows))

    def stage1_parameters(self) -> list[nn.Parameter]:
        return [*self.features.parameters(), *self.window_lstm.parameters()]
