"""The process's descriptor limit, raised and checked at start (core/descriptors.py says what
happens when it runs out anyway).

Every stream holds two descriptors: the client's connection and the upstream's. Distributions
start services with a soft limit of 1,024 (systemd, most shells) under a hard limit of hundreds
of thousands: the soft limit is the process's to raise, and a gateway left at 1,024 refuses
its 500th stream."""

from __future__ import annotations

import logging
import resource

from trio_gateway.config.schema import GatewayConfig

log = logging.getLogger("trio_gateway")

# Descriptors besides the streams: listeners, the log, the ledger, Redis, probes, idle upstream
# connections, the reserve that refuses at the limit (http1/exhaustion.py), the interpreter's.
OVERHEAD = 64
# What a soft limit is raised to when the hard one is unlimited (setrlimit refuses more than
# the kernel's fs.nr_open, whose default is this).
UNLIMITED_CEILING = 1 << 20


def streams_at_most(config: GatewayConfig) -> int:
    """The streams the config lets one process hold at once: every provider's (every
    replica's) ``max_inflight``. Requests waiting in a queue hold a client descriptor too."""
    return sum(p.max_inflight * max(1, len(p.endpoints)) for p in config.providers().values())


def descriptors_needed(config: GatewayConfig) -> int:
    return 2 * streams_at_most(config) + OVERHEAD


def raise_descriptor_limit(config: GatewayConfig) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one, and warn when even that cannot hold
    the config's streams. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        target = soft
    else:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, exc)
            target = soft
    needed = descriptors_needed(config)
    if target != resource.RLIM_INFINITY and target < needed:
        log.warning(
            "the descriptor limit (%d) is below what the providers' max_inflight may hold "
            "(%d streams x 2 descriptors + %d = %d): past it, requests are answered 503 "
            "overloaded; raise the hard limit (LimitNOFILE=, ulimit -Hn; docs/operations.md)",
            target,
            streams_at_most(config),
            OVERHEAD,
            needed,
        )
    return target
