"""How much a provider may take: the gates (max_inflight, in process or leased in Redis), health,
and the replica policies of a group of vLLM servers."""
