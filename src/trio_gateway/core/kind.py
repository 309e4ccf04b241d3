"""Which OpenAI endpoint a request came to: the one thing besides its body that decides how a
provider is asked and how its answer is read back."""

from __future__ import annotations

import enum


class RequestKind(enum.Enum):
    """The endpoint of a request, by its usage-record name (``docs/accounting.md``)."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"

    @property
    def path(self) -> str:
        """The gateway's path for it, which is also the vendor's below its ``/v1``."""
        return PATHS[self]


PATHS = {
    RequestKind.CHAT: "/v1/chat/completions",
    RequestKind.COMPLETIONS: "/v1/completions",
    RequestKind.EMBEDDINGS: "/v1/embeddings",
}
