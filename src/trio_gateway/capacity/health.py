"""Provider health: a pure state machine fed by readiness probes and by real traffic.

A provider is ``starting`` until it first answers (vLLM loads weights and compiles for minutes
and answers nothing meanwhile), ``healthy`` while it answers, and ``unhealthy`` after
``unhealthy_after`` failures in a row; ``healthy_after`` successes in a row bring it back. A
saturated provider is not an unhealthy one: refusals at the gate never count as failures.

A provider that has never answered and whose last probe (or request) failed is ``unreachable``:
still in rotation within ``startup_grace_s`` (a loading vLLM refuses connections too), but
shown apart from ``starting``, and each failed probe is a warning, because a typo'd
``base_url`` fails in exactly the same way and must not look healthy for the whole grace.

Only a refused connection or a timeout can be a server still loading (:func:`could_be_loading`);
a server that answered is up, so its answered failures (a 5xx, a 401) count as they would after
the grace, and an answer that the model or the route does not exist (a 404,
``ModelNotServed``, or a refusal naming ``model``) makes it unhealthy at once.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import (
    DescriptorsExhausted,
    GatewayError,
    ModelNotServed,
    RequestError,
    UpstreamTimeout,
    UpstreamUnreachable,
)

log = logging.getLogger("trio_gateway.health")


class State(enum.Enum):
    STARTING = "starting"
    UNREACHABLE = "unreachable"  # never answered, and its last attempt failed
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@attrs.frozen(kw_only=True)
class HealthSnapshot:
    state: State
    consecutive_failures: int
    consecutive_successes: int
    cooling_down: bool
    last_error: str | None
    upstream_load: int | None  # the provider's own count of requests it holds (vLLM /load)


class ProviderHealth:
    """One provider's health and rate-limit cool-down. Times are ``trio.current_time()`` values,
    passed in, so the machine is testable without a clock."""

    def __init__(self, config: ProviderConfig, *, now: float) -> None:
        self._unhealthy_after = config.unhealthy_after
        self._healthy_after = config.healthy_after
        self._grace_ends = now + config.startup_grace_s
        self.state = State.STARTING
        self._failures = 0
        self._successes = 0
        self._cooldown_until = 0.0
        self.last_error: str | None = None
        self.upstream_load: int | None = None
        self.changed = trio.Event()  # set and replaced on every state change, for waiters

    def _set(self, state: State) -> None:
        if state is not self.state:
            self.state = state
            self.changed.set()
            self.changed = trio.Event()

    def success(self) -> None:
        self._failures = 0
        self._successes += 1
        self.last_error = None
        if self.state in (State.STARTING, State.UNREACHABLE) or (
            self.state is State.UNHEALTHY and self._successes >= self._healthy_after
        ):
            self._set(State.HEALTHY)

    def failure(self, reason: str, *, now: float, answered: bool = False) -> None:
        """``answered``: the server answered (it is not loading), so the grace does not
        hold its failures."""
        self._successes = 0
        self._failures += 1
        self.last_error = reason
        in_grace = now < self._grace_ends and not answered
        if self.state in (State.STARTING, State.UNREACHABLE) and (
            in_grace or self._failures < self._unhealthy_after
        ):
            # Never answered: maybe still loading, maybe a wrong address; in rotation until
            # the grace is over, but no longer shown as merely starting.
            self._set(State.UNREACHABLE)
        elif self._failures >= self._unhealthy_after:
            self._set(State.UNHEALTHY)

    def not_serving(self, reason: str) -> None:
        """The server answered that the configured model or route does not exist: no request
        can succeed there, loading or not. Unhealthy at once; ``healthy_after`` successes in a
        row bring it back (the server was fixed)."""
        self._successes = 0
        self._failures = max(self._failures + 1, self._unhealthy_after)
        self.last_error = reason
        self._set(State.UNHEALTHY)

    def grace_left(self, now: float) -> float:
        """Seconds of ``startup_grace_s`` still to run (0 once it is over)."""
        return max(0.0, self._grace_ends - now)

    def cool_down(self, until: float) -> None:
        self._cooldown_until = max(self._cooldown_until, until)

    def cooling_down(self, now: float) -> bool:
        return now < self._cooldown_until

    def in_rotation(self, now: float) -> bool:
        return self.state is not State.UNHEALTHY and not self.cooling_down(now)

    def snapshot(self, now: float) -> HealthSnapshot:
        return HealthSnapshot(
            state=self.state,
            consecutive_failures=self._failures,
            consecutive_successes=self._successes,
            cooling_down=self.cooling_down(now),
            last_error=self.last_error,
            upstream_load=self.upstream_load,
        )


def could_be_loading(error: GatewayError) -> bool:
    """Whether a failure could be a server still starting (vLLM loads weights and compiles
    for minutes and answers nothing meanwhile): a refused connection or a timeout. Anything
    else came from a server that is up."""
    return isinstance(error, UpstreamUnreachable | UpstreamTimeout)


def names_what_is_not_served(error: RequestError) -> bool:
    """A refusal of the probe's own request that is about the model, not a parameter: the
    probe sends no client's model, only the configured one."""
    return error.param == "model"


Probe = Callable[[], Awaitable[None]]
# Distinct refusals of the probe's own request remembered per provider, so each is logged once.
MAX_LOGGED_REFUSALS = 32
ReadLoad = Callable[[], Awaitable[int | None]]


async def _no_load() -> None:
    return None


async def probe_service(
    name: str,
    config: ProviderConfig,
    health: ProviderHealth,
    probe: Probe,
    read_load: ReadLoad = _no_load,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe every ``probe_interval_s`` until cancelled. ``probe`` raises on failure; after a
    success, ``read_load`` notes how loaded the provider says it is.

    The first probe runs at once, so a gateway learns its providers' state at start-up.

    Only a ``GatewayError`` (or the probe's deadline) is the provider's failure, but for
    ``DescriptorsExhausted``: the gateway out of descriptors, it leaves the state as it is.
    Anything else
    is a bug in the gateway: it is logged with its traceback, and the provider's state is left
    as it was, since the provider did nothing wrong.

    A ``RequestError`` (a 4xx the probe's own request earned, or a request the dialect would not
    send) is neither: the provider answered, so it counts as a success, and the refusal is a
    configuration error (a model family, a field the model refuses), logged at ERROR once
    per distinct message and kept as the provider's ``last_error`` until real traffic succeeds.
    But a refusal that the model or the route does not exist (``ModelNotServed``, a refusal
    naming ``model``) makes the provider unhealthy at once, logged at ERROR once per message:
    no request can succeed there. A failure that is not a refused connection or a timeout is
    counted as answered (:func:`could_be_loading`): the start-up grace does not hold it.
    """
    task_status.started()
    refusals: dict[str, None] = {}
    while True:
        before = health.state
        failure: str | None = None
        answered = False
        try:
            with trio.fail_after(config.probe_timeout_s):
                await probe()
        except trio.TooSlowError:
            failure = f"probe timed out after {config.probe_timeout_s:g} s"
        except DescriptorsExhausted:
            pass  # the gateway's own limit (core/descriptors.py) says nothing of the provider
        except ModelNotServed as exc:
            _not_serving(name, health, str(exc), refusals)
        except RequestError as exc:
            if names_what_is_not_served(exc):
                _not_serving(name, health, f"probe request refused: {exc}", refusals)
            else:
                health.success()
                health.last_error = f"probe request refused: {exc}"
                _log_refusal(name, exc, refusals)
        except GatewayError as exc:
            failure = f"probe failed: {exc}"
            answered = not could_be_loading(exc)
        except Exception:
            log.exception("provider %s: the readiness probe itself failed (a gateway bug)", name)
        else:
            health.success()
            health.upstream_load = await read_load()
        if failure is not None:
            health.failure(failure, now=trio.current_time(), answered=answered)
        if failure is not None and health.state is State.UNREACHABLE:
            log_unreachable(name, config, health, now=trio.current_time())
        else:
            log_transition(name, before, health)
        await trio.sleep(config.probe_interval_s)


def log_unreachable(
    name: str, config: ProviderConfig, health: ProviderHealth, *, now: float
) -> None:
    """A warning for each failed probe of a provider that never answered: during the grace it
    stays in rotation, so this line is what tells a wrong ``base_url`` (or a vLLM that never
    finishes loading) from one still loading normally."""
    left = health.grace_left(now)
    if left > 0:
        then = f"in rotation for {left:.0f} s more of startup_grace_s"
    else:
        then = "startup_grace_s is over: unhealthy after unhealthy_after failures in a row"
    log.warning(
        "provider %s: unreachable at %s, it has never answered (%s); %s",
        name,
        config.endpoint,
        health.last_error,
        then,
    )


def _first_time(message: str, seen: dict[str, None]) -> bool:
    """Whether ``message`` is new to this provider's probe (then remembered, boundedly)."""
    if message in seen:
        return False
    if len(seen) >= MAX_LOGGED_REFUSALS:
        del seen[next(iter(seen))]
    seen[message] = None
    return True


def _not_serving(name: str, health: ProviderHealth, reason: str, seen: dict[str, None]) -> None:
    health.not_serving(reason)
    if _first_time(reason, seen):
        log.error(
            "provider %s: the readiness probe's request names a model or route the server "
            "does not serve; unhealthy until a probe succeeds (check model and base_url): %s",
            name,
            reason,
        )


def _log_refusal(name: str, exc: RequestError, seen: dict[str, None]) -> None:
    message = str(exc)
    if not _first_time(message, seen):
        return
    field = f" (field {exc.param!r})" if exc.param else ""
    log.error(
        "provider %s: the readiness probe's own request was refused%s, a configuration error "
        "(the provider answered, so it stays in rotation): %s",
        name,
        field,
        message,
    )


def log_transition(name: str, before: State, health: ProviderHealth) -> None:
    """One line when a provider (or replica) changes state, whatever made it: a probe, or
    real traffic failing ``unhealthy_after`` times in a row."""
    if health.state is before:
        return
    log.log(
        logging.WARNING if health.state in (State.UNHEALTHY, State.UNREACHABLE) else logging.INFO,
        "provider %s: %s -> %s%s",
        name,
        before.value,
        health.state.value,
        f" ({health.last_error})" if health.last_error else "",
    )
