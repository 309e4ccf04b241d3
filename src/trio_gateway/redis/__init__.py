"""The gateway's own small Redis client (RESP over trio) and its URL parsing, shared by the
gates' leases and by accounting. Imports nothing else of the gateway."""
