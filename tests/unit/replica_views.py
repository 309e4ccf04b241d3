"""Replica views shared by the routing policy tests and the session key tests."""

from __future__ import annotations

from trio_gateway.capacity.replica_policy import ReplicaView


def idle(*names: str, capacity: int = 8) -> list[ReplicaView]:
    return [ReplicaView(name, 0, capacity) for name in names]
