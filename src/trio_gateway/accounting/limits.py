"""Budgets and rate limits, the arithmetic only. Pure: the stores (limit_store.py) keep state.

Money is counted in integer *nanos* (1e-9 of the budget's unit) so that sums never drift and
Redis (``INCRBY``; Lua numbers are exact integers up to 2**53 nanos, about 9 million units) and
the in-process store agree to the last digit. A price is per million tokens, so one token costs
``price * 1000`` nanos.

Rate limits are GCRA (the generic cell rate algorithm): one number per limit, the theoretical
arrival time ``tat``. A limit of ``L`` per minute emits one unit every ``60 / L`` seconds and
allows a burst of the whole ``L``; a request of ``n`` units is allowed when, after it, ``tat``
is no more than one minute ahead of now.
"""

from __future__ import annotations

import math

import attrs

NANOS_PER_UNIT = 1_000_000_000
# A price is per million tokens: nanos per token = price * NANOS_PER_UNIT / 1e6.
NANOS_PER_TOKEN_PER_PRICE = NANOS_PER_UNIT // 1_000_000
WINDOW_S = 60.0


@attrs.frozen(kw_only=True)
class Prices:
    """One provider's prices, per million tokens (input, cached input, output)."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0


def nanos(amount: float) -> int:
    """A budget in units → nanos (rounded down: a budget never grows by rounding)."""
    return math.floor(amount * NANOS_PER_UNIT)


def exact_units(amount_nanos: int) -> str:
    """Nanos in the prices' unit, exactly, without trailing zeros: ``4.998765625``, ``5``."""
    units, fraction = divmod(amount_nanos, NANOS_PER_UNIT)
    return f"{units}.{fraction:09d}".rstrip("0").rstrip(".")


def format_units(amount_nanos: int, places: int = 6) -> str:
    """Nanos in the prices' unit, to ``places`` decimals, rounded up (as costs are): an amount
    that is not zero never shows as 0.000000."""
    scale = 10 ** (9 - places)
    units, fraction = divmod(-(-amount_nanos // scale), 10**places)
    return f"{units}.{fraction:0{places}d}"


def cost_nanos(prices: Prices, prompt: int, cached: int, completion: int) -> int:
    """What ``prompt`` tokens (``cached`` of them from the cache) and ``completion`` tokens
    cost, rounded up to a nano (a provider's invoice never exceeds the gateway's count)."""
    cached = min(max(cached, 0), max(prompt, 0))
    uncached = max(prompt, 0) - cached
    exact = (
        uncached * prices.input + cached * prices.cached_input + max(completion, 0) * prices.output
    ) * NANOS_PER_TOKEN_PER_PRICE
    return math.ceil(round(exact, 6))


def reserve_tokens(prompt_estimate: int, max_tokens: int | None, default_max_tokens: int) -> int:
    """The tokens a request may use at most: its prompt estimate plus what it may generate."""
    out = max_tokens if max_tokens is not None and max_tokens > 0 else default_max_tokens
    return max(prompt_estimate, 0) + out


def reserve_nanos(prices: Prices, prompt_estimate: int, max_out: int) -> int:
    """The hold for a request not yet answered: as if nothing were cached."""
    return cost_nanos(prices, prompt_estimate, 0, max_out)


def covers(budget: int, spent: int, held: int, amount: int) -> bool:
    """Whether a budget still covers ``amount`` beside what is spent and held."""
    return spent + held + amount <= budget


@attrs.frozen(kw_only=True)
class RateDecision:
    """One limit's answer: allowed or not, and what the ``x-ratelimit-*`` headers say."""

    allowed: bool
    limit: int
    remaining: int
    reset_s: float  # until the limit is whole again
    retry_after_s: float  # 0 when allowed
    tat: float  # the new state (unchanged when refused)


def gcra(tat: float, now: float, limit: int, cost: int) -> RateDecision:
    """GCRA for ``limit`` per minute; ``cost`` units now. A cost above the limit counts as
    the whole limit (the request runs when the limit is whole, instead of never)."""
    interval = WINDOW_S / limit
    cost = min(max(cost, 0), limit)
    base = max(tat, now)
    new_tat = base + cost * interval
    allow_at = new_tat - WINDOW_S
    if allow_at > now:
        return RateDecision(
            allowed=False,
            limit=limit,
            remaining=_remaining(base, now, interval, limit),
            reset_s=max(base - now, 0.0),
            retry_after_s=allow_at - now,
            tat=tat,
        )
    return RateDecision(
        allowed=True,
        limit=limit,
        remaining=_remaining(new_tat, now, interval, limit),
        reset_s=max(new_tat - now, 0.0),
        retry_after_s=0.0,
        tat=new_tat,
    )


def _remaining(tat: float, now: float, interval: float, limit: int) -> int:
    # Small epsilon: float steps of 60/L must not lose a whole unit.
    return max(0, min(limit, math.floor((now + WINDOW_S - tat) / interval + 1e-9)))


def reset_text(seconds: float) -> str:
    """OpenAI's spelling of a reset time (Go's of a duration): ``20ms``, ``1s``, ``6m0s``,
    ``25h1m1s``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def budget_headers(
    budget: int, remaining: int, renews_in_s: float | None
) -> list[tuple[bytes, bytes]]:
    """A budget's headers, in the ``x-ratelimit-*`` family's shape (docs/accounting.md says
    why these): the budget, what is left of it after this request's hold (never below 0), and,
    for a budget that renews, until when."""
    headers = [
        (b"x-ratelimit-limit-budget", exact_units(budget).encode()),
        (b"x-ratelimit-remaining-budget", exact_units(max(remaining, 0)).encode()),
    ]
    if renews_in_s is not None:
        headers.append((b"x-ratelimit-reset-budget", reset_text(renews_in_s).encode()))
    return headers


def rate_headers(
    requests: RateDecision | None, tokens: RateDecision | None
) -> list[tuple[bytes, bytes]]:
    """The ``x-ratelimit-*`` headers for the limits a key has."""
    headers: list[tuple[bytes, bytes]] = []
    for kind, decision in (("requests", requests), ("tokens", tokens)):
        if decision is None:
            continue
        headers += [
            (f"x-ratelimit-limit-{kind}".encode(), str(decision.limit).encode()),
            (f"x-ratelimit-remaining-{kind}".encode(), str(decision.remaining).encode()),
            (f"x-ratelimit-reset-{kind}".encode(), reset_text(decision.reset_s).encode()),
        ]
    return headers
