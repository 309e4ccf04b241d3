"""Every kind of gate a provider may have: its own slots (``LocalGate``), leases in Redis
(``SharedGate``), or the host's slots through the supervisor (``HostGate``)."""

from __future__ import annotations

from trio_gateway.capacity.gate import LocalGate, SharedGate
from trio_gateway.capacity.host_gate import HostGate

Gate = LocalGate | SharedGate | HostGate
