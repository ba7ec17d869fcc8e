"""When `clstm-ppo trade` may decide: after the close of a session, on that session's date (New York time), by the
broker's clock and calendar (docs/trading.md "When it runs"). No session today is `NoSessionToday`, reported
without an error status (a daily schedule fires on holidays too); a session not yet closed is a `UserError`, since
the plan would use yesterday's close and trade into today's session. A day missed is not caught up later.
"""

from __future__ import annotations

from datetime import datetime

from clstm_ppo.trading.broker import NY, Session
from envs.errors import UserError


class NoSessionToday(Exception):
    """Today has no session: nothing to decide (not an error for a daily schedule)."""


def decision_session(now: datetime, sessions: list[Session]) -> Session:
    """Today's session, when ``now`` (aware) is at or after its close; `NoSessionToday` / `UserError` otherwise.

    :param sessions: the calendar's sessions around ``now`` (at least today's date, when it has one).
    """
    local = now.astimezone(NY)
    today = local.date()
    session = next((s for s in sessions if s.day == today), None)
    if session is None:
        later = [s.day for s in sessions if s.day > today]
        nxt = f"; the next session is {later[0].isoformat()}" if later else ""
        raise NoSessionToday(
            f"market closed today ({today.isoformat()}, {local:%A}: weekend or holiday): no session "
            f"to decide on, nothing sent{nxt}"
        )
    if local < session.close:
        raise UserError(
            f"today's session ({today.isoformat()}) closes at {session.close:%H:%M} ET and the decision uses its "
            f"closing bars: run after the close (it is {local:%H:%M} ET now); nothing was sent"
        )
    return session
