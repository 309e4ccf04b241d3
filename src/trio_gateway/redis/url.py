"""``[redis] url``: checked by the config without importing the Redis client."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import attrs


@attrs.frozen(kw_only=True)
class RedisAddress:
    host: str
    port: int
    db: int
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    # rediss://: TLS, the server's certificate and name checked.
    tls: bool = False

    def display(self) -> str:
        """For logs: never the password."""
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}/{self.db}"


def parse_redis_url(url: str) -> RedisAddress:
    """``redis[s]://[[USER]:PASSWORD@]HOST:PORT/DB`` → its parts; ValueError for anything
    else."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError("expected redis://HOST:PORT/DB or rediss://HOST:PORT/DB (TLS)")
    db_text = parts.path.lstrip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"database {db_text!r} is not a number")
    try:
        port = parts.port or 6379
    except ValueError as exc:
        raise ValueError(f"port: {exc}") from None
    return RedisAddress(
        host=parts.hostname,
        port=port,
        db=int(db_text),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        tls=parts.scheme == "rediss",
    )
