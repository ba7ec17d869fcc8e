"""The trading environments (envs/vector_env.py, envs/trading_env.py) over the shared kernel."""

from __future__ import annotations

import dataclasses
import math
import warnings

import gymnasium
import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import envs  # noqa: F401 - registers envs/StockTrading-v0
from envs.config import EnvConfig
from envs.data import DayRange, MarketData, Splits, split_days
from envs.errors import UserError
from envs.features import PreparedMarket
from envs.synthetic import generate_market
from envs.trading_env import StockTradingEnv
from envs.vector_env import VectorStockTradingEnv

N = 4
WINDOW = 10

SHARES = dict(
    action_mode="shares", reward="value", execution="close", turnover_penalty=0.0
)  # the paper's rules, which these cases work by hand


@pytest.fixture(scope="module")
def market() -> PreparedMarket:
    data = generate_market(num_tickers=N, num_days=400, seed=2)
    return PreparedMarket.prepare(data, split_days(data, window=WINDOW), window=WINDOW)


def _actions(steps: int, b: int, n: int = N, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(b, n, generator=g) * 2 - 1 for _ in range(steps)]


def test_gym_env_and_vector_env_agree_step_by_step(market: PreparedMarket) -> None:
    # 13 days per episode with a 10-day window: auto-resets land on varying ring positions.
    cfg = EnvConfig(episode_length=13, **SHARES)
    venv = VectorStockTradingEnv(market, num_envs=1, config=cfg, seed=3)
    env = StockTradingEnv(market, config=cfg, seed=3)
    vobs, _ = venv.reset(seed=11)
    obs, _ = env.reset(seed=11)
    np.testing.assert_array_equal(vobs[0].numpy(), obs)
    episodes = 0
    for action in _actions(65, 1):
        vobs, vrew, vterm, vtrunc, vinfo = venv.step(action)
        obs, rew, term, trunc, info = env.step(action[0].numpy())
        assert (bool(vterm[0]), bool(vtrunc[0])) == (term, trunc)
        assert float(vrew[0]) == rew
        assert info["portfolio_value"] == float(vinfo["portfolio_value"][0])
        if term or trunc:
            episodes += 1
            np.testing.assert_array_equal(vinfo["final_obs"][0].numpy(), obs)
            assert info["episode"] == {k: v[0].item() for k, v in vinfo["episode"].items()}
            obs, _ = env.reset()  # same generator draws -> same new start day as the auto-reset
        np.testing.assert_array_equal(vobs[0].numpy(), obs)
    assert episodes == 5


def test_hand_worked_next_open_fills() -> None:
    """--execution next_open: orders sized at day t's close fill at day t+1's open (the pro-rata cap and the costs
    at the open's prices); the portfolio is valued at day t+1's close as before."""
    close = np.array([[10.0, 20.0], [11.0, 19.0], [12.0, 18.0]])
    opens = np.array([[10.0, 20.0], [10.5, 19.5], [12.2, 17.8]])
    data = MarketData(
        dates=pd.bdate_range("2021-03-01", periods=3).to_numpy().astype("datetime64[ns]"),
        tickers=("AAA", "BBB"),
        open=opens,
        high=np.maximum(opens, close) * 1.01,
        low=np.minimum(opens, close) * 0.99,
        close=close,
        volume=np.ones_like(close),
    )
    market = PreparedMarket.prepare(data, Splits(DayRange(0, 3), None, None), window=1, use_turbulence=False)
    rules = {**SHARES, "execution": "next_open"}
    cfg = EnvConfig(
        hmax=100,
        initial_amount=1000.0,
        buy_cost_pct=0.01,
        sell_cost_pct=0.02,
        reward_scaling=1.0,
        episode_length="full",
        **rules,
    )
    env = VectorStockTradingEnv(market, num_envs=1, config=cfg)
    env.reset()
    # Day 0: orders 50 and 25 shares (sized at the close); at day 1's open they cost 50 x 10.605 + 25 x 19.695 =
    # $1,022.625 > $1,000: scaled by 1000/1022.625 and floored to 48 and 24 for 509.04 + 472.68 = $981.72
    # (costs 5.04 + 4.68 = $9.72). Cash 18.28; value at day 1's close 18.28 + 48 x 11 + 24 x 19 = $1,002.28.
    obs, reward, term, trunc, info = env.step(torch.tensor([[0.5, 0.255]]))
    assert info["shares_traded"].tolist() == [[48.0, 24.0]]
    assert info["fill_prices"].tolist() == [[10.5, 19.5]]
    assert info["cash"].item() == pytest.approx(18.28, abs=1e-9)
    assert info["costs"].item() == pytest.approx(9.72, abs=1e-9)
    assert info["portfolio_value"].item() == pytest.approx(1002.28, abs=1e-9)
    assert reward.item() == pytest.approx(2.28, abs=1e-4)
    # Day 1: sell all 48 AAA at day 2's open 12.2 (-2%: $573.888), buy 10 BBB at 17.8 x 1.01 = $179.78:
    # cash $412.388, costs 11.712 + 1.78; value at day 2's close 412.388 + 34 x 18 = $1,024.388.
    obs, reward, term, trunc, info = env.step(torch.tensor([[-1.0, 0.1]]))
    assert info["shares_traded"].tolist() == [[-48.0, 10.0]]
    assert info["cash"].item() == pytest.approx(412.388, abs=1e-9)
    assert info["costs"].item() == pytest.approx(13.492, abs=1e-9)
    assert info["portfolio_value"].item() == pytest.approx(1024.388, abs=1e-9)
    assert reward.item() == pytest.approx(22.108, abs=1e-4) and term.item()
    # next_close on the same data fills day 0's orders at day 1's close instead
    env = VectorStockTradingEnv(market, num_envs=1, config=dataclasses.replace(cfg, execution="next_close"))
    env.reset()
    *_, info = env.step(torch.tensor([[0.5, 0.255]]))
    assert info["fill_prices"].tolist() == [[11.0, 19.0]]


def test_cash_earns_interest_and_holders_receive_dividends_by_hand() -> None:
    """risk_free 0.0252 a year is (1.0252)^(1/252) - 1 a day on the cash after the trade; a $0.50 dividend of AAA on
    day 2 is paid on the shares held at day 1's close: after day 1's trade at close fills, before it otherwise."""
    close = np.array([[10.0, 20.0], [11.0, 19.0], [12.0, 18.0], [12.5, 18.5]])
    dividends = np.zeros_like(close)
    dividends[2, 0] = 0.5
    data = MarketData(
        dates=pd.bdate_range("2021-03-01", periods=4).to_numpy().astype("datetime64[ns]"),
        tickers=("AAA", "BBB"),
        open=close,
        high=close * 1.01,
        low=close * 0.99,
        close=close,
        volume=np.ones_like(close),
        dividends=dividends,
    )
    market = PreparedMarket.prepare(data, Splits(DayRange(0, 4), None, None), window=1, use_turbulence=False)
    daily = 1.0252 ** (1 / 252) - 1
    for execution, held in (("close", 60.0), ("next_open", 10.0)):
        rules = {**SHARES, "execution": execution}
        cfg = EnvConfig(
            hmax=100,
            initial_amount=1000.0,
            buy_cost_pct=0.0,
            sell_cost_pct=0.0,
            reward_scaling=1.0,
            episode_length="full",
            risk_free=0.0252,
            **rules,
        )
        env = VectorStockTradingEnv(market, num_envs=1, config=cfg)
        env.reset()
        *_, info = env.step(torch.tensor([[0.1, 0.0]]))  # buy 10 AAA
        fill = 10.0 if execution == "close" else 11.0
        cash = (1000.0 - 10 * fill) * (1 + daily)
        assert info["cash"].item() == pytest.approx(cash, rel=1e-12) and info["dividends"].item() == 0.0
        *_, info = env.step(torch.tensor([[0.5, 0.0]]))  # buy 50 more AAA: held from day 1's close, or day 2's open
        fill = 11.0 if execution == "close" else 12.0
        cash = (cash - 50 * fill) * (1 + daily) + 0.5 * held
        assert info["dividends"].item() == pytest.approx(0.5 * held)
        assert info["cash"].item() == pytest.approx(cash, rel=1e-12)
        assert info["portfolio_value"].item() == pytest.approx(cash + 60 * 12.0, rel=1e-12)


def test_auto_execution_is_next_open_and_next_close_on_close_only_data(market: PreparedMarket) -> None:
    from envs.execution import describe_execution, resolve_execution

    assert resolve_execution("auto", market.data) == "next_open"
    flat = dataclasses.replace(market.data, close_only=True)
    assert resolve_execution("auto", flat) == "next_close"
    assert "closes only" in describe_execution("auto", flat)
    with pytest.raises(UserError, match="next_open needs opening prices"):
        resolve_execution("next_open", flat)
    assert VectorStockTradingEnv(market, config=EnvConfig()).execution == "next_open"


def test_hand_worked_two_stocks_three_days() -> None:
    close = np.array([[10.0, 20.0], [11.0, 19.0], [12.0, 18.0]])
    dates = pd.bdate_range("2021-03-01", periods=3).to_numpy().astype("datetime64[ns]")
    data = MarketData(
        dates=dates,
        tickers=("AAA", "BBB"),
        open=close,
        high=close * 1.01,
        low=close * 0.99,
        close=close,
        volume=np.ones_like(close),
    )
    market = PreparedMarket.prepare(data, Splits(DayRange(0, 3), None, None), window=1, use_turbulence=False)
    cfg = EnvConfig(
        hmax=100,
        initial_amount=1000.0,
        buy_cost_pct=0.01,
        sell_cost_pct=0.02,
        reward_scaling=1.0,
        episode_length="full",
        **SHARES,
    )
    env = VectorStockTradingEnv(market, num_envs=1, config=cfg)
    obs, info = env.reset()
    assert obs.shape == (1, 1, 1 + 2 + 2 + 8) and obs[0, 0, 0] == 1.0 and int(info["day"][0]) == 0

    # Day 0 at $10 / $20, cash $1,000. Action (0.5, 0.255) -> orders 50 and 25 shares costing
    # 50 x 10.10 + 25 x 20.20 = $1,010 > $1,000, so both are scaled by 1000/1010 = 0.990099 and
    # floored: 49 and 24 shares for 494.90 + 484.80 = $979.70 (costs 4.90 + 4.80 = $9.70).
    # Cash 20.30. Value at day 1's close: 20.30 + 49 x 11 + 24 x 19 = $1,015.30 -> reward +15.30.
    obs, reward, term, trunc, info = env.step(torch.tensor([[0.5, 0.255]]))
    assert info["shares_traded"].tolist() == [[49.0, 24.0]]
    assert info["cash"].item() == pytest.approx(20.30, abs=1e-9)
    assert info["costs"].item() == pytest.approx(9.70, abs=1e-9)
    assert info["portfolio_value"].item() == pytest.approx(1015.30, abs=1e-9)
    assert reward.item() == pytest.approx(15.30, abs=1e-4)
    assert not term.item() and not trunc.item()
    # The day-1 observation shows the new portfolio: cash / 1000, shares / 1000.
    assert obs[0, 0, 0].item() == pytest.approx(0.0203, abs=1e-7)
    assert obs[0, 0, 3:5].tolist() == pytest.approx([0.049, 0.024], abs=1e-7)

    # Day 1 at $11 / $19. Action (-1, 0.1) -> sell min(100, 49) = 49 for $539, minus 2% = $10.78:
    # cash 20.30 + 528.22 = $548.52; buy 10 x 19 x 1.01 = $191.90 -> cash $356.62, costs 10.78 + 1.90.
    # Holdings (0, 34). Value at day 2: 356.62 + 34 x 18 = $968.62 -> reward 968.62 - 1015.30 = -46.68.
    # Day 2 is the split's last day: terminated.
    obs, reward, term, trunc, info = env.step(torch.tensor([[-1.0, 0.1]]))
    assert info["shares_traded"].tolist() == [[-49.0, 10.0]]
    assert info["cash"].item() == pytest.approx(356.62, abs=1e-9)
    assert info["costs"].item() == pytest.approx(12.68, abs=1e-9)
    assert info["portfolio_value"].item() == pytest.approx(968.62, abs=1e-9)
    assert reward.item() == pytest.approx(-46.68, abs=1e-4)
    assert term.item() and not trunc.item()
    ep = {k: v[0].item() for k, v in info["episode"].items()}
    r1, r2 = 1015.30 / 1000 - 1, 968.62 / 1015.30 - 1
    mean, std = (r1 + r2) / 2, abs(r1 - r2) / math.sqrt(2)
    assert ep["sharpe"] == pytest.approx(mean / std * math.sqrt(252))
    assert ep["max_drawdown"] == pytest.approx(1 - 968.62 / 1015.30)
    assert ep["final_value"] == pytest.approx(968.62) and ep["return"] == pytest.approx(-0.03138)
    assert ep["reward"] == pytest.approx(-31.38) and ep["costs"] == pytest.approx(22.38)
    assert (ep["trades"], ep["length"]) == (4, 2)  # 2 stocks bought, then 1 sold and 1 bought
    # Same-step auto-reset: back to day 0 with the starting portfolio.
    assert obs[0, 0, 0].item() == 1.0 and obs[0, 0, 3:5].tolist() == [0.0, 0.0]


def test_accounting_invariants_over_random_episodes(market: PreparedMarket) -> None:
    cfg = EnvConfig(episode_length=30, **SHARES)
    env = VectorStockTradingEnv(market, num_envs=5, config=cfg, seed=1)
    close = torch.as_tensor(market.data.close)
    _, info = env.reset(seed=4)
    cash, day = info["cash"], info["day"]
    shares = torch.zeros(5, N, dtype=torch.float64)
    for action in _actions(70, 5, seed=2):
        _, _, term, trunc, info = env.step(action * 1.5)  # also exercises clipping
        traded = info["shares_traded"]
        price = close[day]  # trades happen at the close of the day the action was taken on
        new_shares = shares + traded
        assert (new_shares >= 0).all() and torch.equal(new_shares, new_shares.round())
        assert (info["cash"] >= 0).all()
        sold, bought = (-traded).clamp_min(0), traded.clamp_min(0)
        costs = (sold * price).sum(1) * cfg.sell_cost_pct + (bought * price).sum(1) * cfg.buy_cost_pct
        torch.testing.assert_close(info["costs"], costs, rtol=1e-10, atol=1e-8)
        torch.testing.assert_close(info["cash"], cash - (traded * price).sum(1) - costs, rtol=1e-10, atol=1e-6)
        assert torch.equal(info["day"], day + 1)
        value = info["cash"] + (new_shares * close[info["day"]]).sum(1)
        torch.testing.assert_close(info["portfolio_value"], value, rtol=1e-12, atol=1e-6)
        done = term | trunc
        # Restart the bookkeeping of envs that auto-reset (their new day comes from env internals).
        shares = torch.where(done[:, None], 0.0, new_shares)
        cash = torch.where(done, cfg.initial_amount, info["cash"])
        day = torch.where(done, env._day, info["day"])


def test_turbulent_day_liquidates(market: PreparedMarket) -> None:
    turbulence = np.zeros(market.data.num_days)
    stormy = market.splits.train.start + 40
    turbulence[stormy] = 10.0
    m = dataclasses.replace(market, turbulence=turbulence, turbulence_threshold=5.0)
    env = StockTradingEnv(m, config=EnvConfig(episode_length="full", **SHARES))
    env.reset(options={"start_day": stormy - 3})
    for _ in range(3):
        _, _, _, _, info = env.step(np.ones(N, dtype=np.float32))
    held = info["holdings"]
    assert info["day"] == stormy and (held > 0).all()
    _, _, term, trunc, info = env.step(np.ones(N, dtype=np.float32))  # wants to buy; must sell all
    assert (info["holdings"] == 0).all() and not term and not trunc
    np.testing.assert_array_equal(info["trades"], -held)
    assert info["costs"] == pytest.approx(float((held * m.data.close[stormy]).sum()) * 1e-3)
    _, _, _, _, info = env.step(np.ones(N, dtype=np.float32))  # calm again: buys resume
    assert (info["holdings"] > 0).all()


def _recompute(values: list[float], initial: float) -> dict[str, float]:
    v = np.asarray([initial, *values])
    r = v[1:] / v[:-1] - 1
    sharpe = r.mean() / r.std(ddof=1) * math.sqrt(252) if len(r) > 1 and r.std(ddof=1) > 0 else 0.0
    peak = np.maximum.accumulate(v)
    return {
        "sharpe": sharpe,
        "max_drawdown": float((1 - v / peak).max()),
        "final_value": v[-1],
        "return": v[-1] / initial - 1,
        "length": len(r),
    }


def test_auto_reset_and_episode_statistics(market: PreparedMarket) -> None:
    B, L = 3, 15
    cfg = EnvConfig(episode_length=L, **SHARES)
    env = VectorStockTradingEnv(market, num_envs=B, config=cfg, seed=9)
    obs, _ = env.reset(seed=9)
    values: list[list[float]] = [[] for _ in range(B)]
    rewards, costs, trades = np.zeros(B), np.zeros(B), np.zeros(B)
    finished = 0
    for action in _actions(3 * L + 2, B, seed=5):
        obs, reward, term, trunc, info = env.step(action)
        assert obs.shape == (B, WINDOW, market.num_features) and obs.dtype == torch.float32
        for b in range(B):
            values[b].append(float(info["portfolio_value"][b]))
        rewards += reward.double().numpy()
        costs += info["costs"].numpy()
        trades += info["num_trades"].numpy()
        done = (term | trunc).numpy()
        assert "_episode" in info if done.any() else "_episode" not in info
        if not done.any():
            assert torch.equal(info["final_obs"], obs)
            continue
        assert torch.equal(info["_episode"], term | trunc) and torch.equal(info["_final_obs"], term | trunc)
        for b in np.flatnonzero(done):
            finished += 1
            ep = {k: v[b].item() for k, v in info["episode"].items()}
            want = _recompute(values[b], cfg.initial_amount)
            for key in ("sharpe", "max_drawdown", "final_value", "return"):
                assert ep[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
            assert ep["length"] == want["length"] == L
            assert ep["reward"] == pytest.approx(rewards[b], rel=1e-5)
            assert ep["costs"] == pytest.approx(costs[b], rel=1e-12)
            assert ep["trades"] == trades[b]
            # final_obs is the finished episode's last window; obs already the new episode's first.
            last_row = info["final_obs"][b, -1]
            assert last_row[0].item() == pytest.approx(float(info["cash"][b]) / cfg.initial_amount, rel=1e-6)
            assert (obs[b, :, 0] == 1.0).all() and (obs[b, :, 1 + N : 1 + 2 * N] == 0).all()
            fresh = VectorStockTradingEnv(market, num_envs=1, config=cfg)
            first, _ = fresh.reset(options={"start_day": int(env._day[b])})
            assert torch.equal(obs[b], first[0])
            values[b], rewards[b], costs[b], trades[b] = [], 0.0, 0.0, 0.0
    assert finished == 3 * B


def test_full_split_episode_terminates_on_its_last_day(market: PreparedMarket) -> None:
    cfg = EnvConfig(episode_length="full", **SHARES)
    env = VectorStockTradingEnv(market, split="validation", num_envs=2, config=cfg)
    _, info = env.reset(seed=0)
    split = market.splits.validation
    assert info["day"].tolist() == [split.start] * 2
    for step in range(1, split.num_days):
        _, _, term, trunc, info = env.step(torch.zeros(2, N))
        assert not trunc.any()
        assert term.all() == (step == split.num_days - 1)
    assert info["day"].tolist() == [split.stop - 1] * 2
    assert info["episode"]["length"].tolist() == [split.num_days - 1] * 2


def test_random_starts_leave_a_full_episode_and_are_seeded(market: PreparedMarket) -> None:
    cfg = EnvConfig(episode_length=50, **SHARES)
    env = VectorStockTradingEnv(market, num_envs=256, config=cfg)
    train = market.splits.train
    days = env.reset(seed=1)[1]["day"]
    assert days.min() >= train.start and days.max() <= train.stop - 1 - 50
    assert len(set(days.tolist())) > 100
    assert torch.equal(env.reset(seed=1)[1]["day"], days)
    assert not torch.equal(env.reset(seed=2)[1]["day"], days)
    long = VectorStockTradingEnv(market, num_envs=4, config=EnvConfig(episode_length=10_000, **SHARES))
    assert long.reset(seed=1)[1]["day"].tolist() == [train.start] * 4  # split shorter than an episode


def test_observation_window_and_no_look_ahead(market: PreparedMarket) -> None:
    cfg = EnvConfig(episode_length="full", **SHARES)
    t = market.splits.train.start + 60
    env = VectorStockTradingEnv(market, num_envs=1, config=cfg)
    obs, _ = env.reset(options={"start_day": t - 5})
    # Window rows are days t-14 .. t-5, oldest first, with the starting portfolio.
    rows = market.normalization.market_rows(market.data.close, market.indicators)
    np.testing.assert_allclose(obs[0, :, 1 : 1 + N].numpy(), rows[t - 14 : t - 4, :N], rtol=1e-6)
    np.testing.assert_allclose(obs[0, :, 1 + 2 * N :].numpy(), rows[t - 14 : t - 4, N:], rtol=1e-6)
    actions = _actions(5, 1, seed=8)
    for a in actions:
        obs, *_ = env.step(a)
    np.testing.assert_allclose(obs[0, -1, 1 : 1 + N].numpy(), rows[t, :N], rtol=1e-6)

    # Change every price after day t, keep the fitted statistics: the day-t observation is unchanged.
    data = market.data
    bump = np.ones_like(data.close)
    bump[t + 1 :] = 1.7
    later = MarketData(
        dates=data.dates,
        tickers=data.tickers,
        open=data.open * bump,
        high=data.high * bump,
        low=data.low * bump,
        close=data.close * bump,
        volume=data.volume,
    )
    other = PreparedMarket.from_spec(later, market.to_spec())
    env2 = VectorStockTradingEnv(other, num_envs=1, config=cfg)
    env2.reset(options={"start_day": t - 5})
    for a in actions:
        obs2, *_ = env2.step(a)
    assert torch.equal(obs, obs2)


def test_window_longer_than_history_repeats_day_zero() -> None:
    data = generate_market(num_tickers=2, num_days=120, seed=0)
    # Splits made for a 5-day window start on day 4; an 8-day window there reaches back before day 0.
    m = PreparedMarket.prepare(data, split_days(data, window=5), window=8, use_turbulence=False)
    env = VectorStockTradingEnv(m, num_envs=1, config=EnvConfig(episode_length="full", **SHARES))
    obs, info = env.reset()
    assert int(info["day"][0]) == 4
    assert torch.equal(obs[0, 0], obs[0, 3]) and not torch.equal(obs[0, 3], obs[0, 4])  # days 0,0,0,0,1,...


def test_gymnasium_make_and_check_env(market: PreparedMarket) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gymnasium.make("envs/StockTrading-v0")
        assert env.observation_space.shape == (30, 181) and env.action_space.shape == (30,)
        check_env(env.unwrapped)
        env = gymnasium.make(
            "envs/StockTrading-v0", market=market, split="test", config=EnvConfig(episode_length=20, **SHARES)
        )
        check_env(env.unwrapped)
        obs, info = env.reset(seed=0)
        assert obs.shape == (WINDOW, market.num_features) and obs.dtype == np.float32
        assert set(info) >= {"date", "portfolio_value", "cash", "holdings", "prices"}
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        assert set(info) >= {"trades", "costs", "num_trades"} and isinstance(reward, float)


def test_vector_env_attributes(market: PreparedMarket) -> None:
    env = VectorStockTradingEnv(market, num_envs=3, config=EnvConfig(**SHARES))
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert env.num_envs == 3 and env.num_tickers == N and env.window == WINDOW
    assert env.num_features == market.num_features == 1 + 2 * N + 4 * N
    assert env.single_observation_space.shape == (WINDOW, env.num_features)
    assert env.observation_space.shape == (3, WINDOW, env.num_features)
    assert env.single_action_space.shape == (N,) and env.action_space.shape == (3, N)
    assert env.device == torch.device("cpu")
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(2, N))
    with pytest.raises(UserError, match="start_day"):
        env.reset(options={"start_day": 0})


def test_gym_env_refuses_to_step_past_the_end(market: PreparedMarket) -> None:
    env = StockTradingEnv(market, config=EnvConfig(episode_length=2, **SHARES))
    env.reset(seed=0)
    env.step(np.zeros(N, dtype=np.float32))
    assert env.step(np.zeros(N, dtype=np.float32))[3]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(N, dtype=np.float32))


def test_state_dict_resumes_bitwise(market: PreparedMarket) -> None:
    cfg = EnvConfig(episode_length=12, **SHARES)
    env = VectorStockTradingEnv(market, num_envs=3, config=cfg, seed=2)
    env.reset(seed=2)
    actions = _actions(30, 3, seed=3)
    for a in actions[:7]:
        env.step(a)
    saved = env.state_dict()
    tail = [env.step(a) for a in actions[7:]]
    other = VectorStockTradingEnv(market, num_envs=3, config=cfg, seed=99)
    other.load_state_dict(saved)
    for a, (obs, rew, term, trunc, _) in zip(actions[7:], tail, strict=True):
        obs2, rew2, term2, trunc2, _ = other.step(a)
        assert torch.equal(obs, obs2) and torch.equal(rew, rew2)
        assert torch.equal(term, term2) and torch.equal(trunc, trunc2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(market: PreparedMarket) -> None:
    cfg = EnvConfig(episode_length=20, **SHARES)
    cpu = VectorStockTradingEnv(market, num_envs=8, config=cfg, seed=1)
    gpu = VectorStockTradingEnv(market, num_envs=8, config=cfg, seed=1, device="cuda")
    o1, _ = cpu.reset(seed=1)
    o2, _ = gpu.reset(seed=1)
    assert o2.device.type == "cuda"
    torch.testing.assert_close(o1, o2.cpu())
    for a in _actions(45, 8, seed=4):
        o1, r1, te1, tr1, i1 = cpu.step(a)
        o2, r2, te2, tr2, i2 = gpu.step(a.cuda())
        torch.testing.assert_close(o1, o2.cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r1, r2.cpu(), rtol=1e-5, atol=1e-5)
        assert torch.equal(te1, te2.cpu()) and torch.equal(tr1, tr2.cpu())
        torch.testing.assert_close(i1["portfolio_value"], i2["portfolio_value"].cpu(), rtol=1e-12, atol=1e-6)


def test_the_shipped_csv_builds_an_env_without_any_warning() -> None:
    """Users should see no warning they cannot act on (a read-only array once made torch warn here)."""
    from envs import MarketData, PreparedMarket, VectorStockTradingEnv  # the package exports the classes
    from tests.conftest import ROOT

    data = MarketData.from_path(ROOT / "examples" / "data" / "stocks_daily_6_ohlcv.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        market = PreparedMarket.prepare(data, split_days(data, window=5), window=5)
        env = VectorStockTradingEnv(market, num_envs=2, config=EnvConfig(episode_length=5, **SHARES))
        env.reset(seed=0)
        env.step(torch.zeros(2, market.num_tickers))


def test_log_return_reward_is_100_times_the_days_log_return(market: PreparedMarket) -> None:
    env = VectorStockTradingEnv(
        market, num_envs=3, config=EnvConfig(reward="log_return", episode_length="full", turnover_penalty=0.0), seed=0
    )
    _, info = env.reset(seed=0)
    before = info["portfolio_value"].clone()
    for action in _actions(5, 3):
        _, reward, _, _, info = env.step(action)
        after = info["portfolio_value"]
        torch.testing.assert_close(reward.double(), 100 * torch.log(after / before), rtol=1e-5, atol=1e-6)
        before = after.clone()
    with pytest.raises(UserError, match="reward"):
        EnvConfig(reward="sharpe")
