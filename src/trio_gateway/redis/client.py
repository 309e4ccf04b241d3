"""Redis through coredis, narrowed to the calls the gateway makes: Lua scripts (budgets and
rate limits), stream appends (usage records) and a few reads.

coredis runs on trio (through anyio) with its own connection pool; this module is the one
place its exceptions are mapped to :class:`RedisError`, so the rest of the gateway decides on
one type (``[redis] on_error``).

- **Retries are off.** coredis would resend a command after a connection error, but a script
  that ran and whose reply was lost would then run twice: a settle charged twice, a rate unit
  taken twice. The caller's deadline and the configured policy decide instead.
- **Deadlines are the caller's** (``[redis] timeout_s`` at each call site). A call cancelled
  mid-reply makes coredis drop that connection, so a half-read reply never reaches the next
  call; the next call dials again, which is all "reconnects by itself" needs.
- **Bounded**: at most ``MAX_CONNECTIONS`` connections; a call past that waits for one, inside
  its caller's deadline.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import coredis
import coredis.exceptions
from coredis.commands.script import Script
from coredis.retry import NoRetryPolicy

from trio_gateway.redis.url import parse_redis_url

MAX_CONNECTIONS = 32


class RedisError(Exception):
    """Redis could not answer: down, slow, restarted, or an error reply."""


Value = bytes | str | int | float


class RedisClient:
    """The gateway's calls, each one command (or one pipelined batch) with errors mapped."""

    def __init__(self, redis: coredis.Redis[bytes] | coredis.RedisCluster[bytes]) -> None:
        self._redis = redis
        self._scripts: dict[str, Script[bytes]] = {}

    async def run_script(self, source: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        """EVALSHA, loading the script when Redis does not know it (after a restart)."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._redis.register_script(source)
        with _mapped():
            return await script(keys=list(keys), args=[str(a) for a in args])

    async def append_stream(
        self, stream: str, maxlen: int, entries: Sequence[Mapping[str, str]]
    ) -> None:
        """One ``XADD STREAM MAXLEN ~ maxlen * ...`` per entry, in one round trip."""
        with _mapped():
            async with self._redis.pipeline(transaction=False) as pipe:
                for fields in entries:
                    pipe.xadd(
                        stream,
                        dict(fields),
                        trim_strategy=coredis.PureToken.MAXLEN,
                        threshold=maxlen,
                        trim_operator=coredis.PureToken.APPROXIMATELY,
                    )

    async def get_int(self, key: str) -> int:
        with _mapped():
            value = await self._redis.get(key)
        return int(value or b"0")

    async def hash_len(self, key: str) -> int:
        with _mapped():
            return await self._redis.hlen(key)

    async def ping(self) -> None:
        with _mapped():
            await self._redis.ping()


def _with_cause(exc: BaseException) -> str:
    """``exc`` and the deepest cause under it: coredis says "Unable to establish a
    connection" of a certificate it refused, the ``ssl`` error under it says which and why."""
    deepest = exc
    for _ in range(8):  # bounded: a chain is short, but never trusted
        cause = deepest.__cause__ or deepest.__context__
        if cause is None:
            break
        deepest = cause
    if deepest is exc or not str(deepest) or str(deepest) in str(exc):
        return str(exc)
    return f"{exc} ({deepest})"


@contextmanager
def _mapped() -> Iterator[None]:
    """coredis's exceptions (and a socket's) → RedisError: the one boundary."""
    try:
        yield
    except coredis.exceptions.ConnectionError as exc:
        raise RedisError(f"redis connection failed: {_with_cause(exc)}") from exc
    except coredis.exceptions.RedisError as exc:
        raise RedisError(f"redis answered with an error: {exc}") from exc
    except OSError as exc:
        raise RedisError(f"redis connection failed: {exc}") from exc


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """``rediss://``'s trust: ``[redis] ca_file``, else the system's store (which OpenSSL takes
    from ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when they are set). The server's name is sent
    (SNI) and checked against its certificate."""
    return ssl.create_default_context(cafile=ca_file)


@asynccontextmanager
async def open_redis(
    url: str, *, ca_file: str | None = None, cluster: bool = False
) -> AsyncIterator[RedisClient]:
    """A client for the life of the block. Nothing is dialled until the first call, so a Redis
    that is down at start-up is the configured policy's business, not a failed start.
    ``cluster``: a Redis Cluster, ``url`` one of its nodes; each call goes to the node of its
    keys' slot (a script's keys share a hash tag: one slot, one node)."""
    address = parse_redis_url(url)
    common: dict[str, Any] = {
        "host": address.host,
        "port": address.port,
        "username": address.username,
        "password": address.password,
        "retry_policy": NoRetryPolicy(),
        "decode_responses": False,
        "ssl_context": tls_context(ca_file) if address.tls else None,
    }
    redis: coredis.Redis[bytes] | coredis.RedisCluster[bytes]
    if cluster:
        # Per node: a cluster of N primaries holds at most N x this.
        redis = coredis.RedisCluster(
            max_connections_per_node=True, max_connections=MAX_CONNECTIONS, **common
        )
    else:
        redis = coredis.Redis(db=address.db, max_connections=MAX_CONNECTIONS, **common)
    async with redis:
        yield RedisClient(redis)
