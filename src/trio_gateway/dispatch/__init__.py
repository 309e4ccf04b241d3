"""From a request to an answer: the Router (alias to providers, admission, gates, failover), the
relay of events and usage, and the live providers it picks from."""
