"""Who may spend what: admission (rate limits and budgets) and their stores, the keys file while
serving, and where usage records go (ledger, Redis stream)."""
