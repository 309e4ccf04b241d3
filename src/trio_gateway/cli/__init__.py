"""The trio-gateway command and its subcommands (serve, check, init, keys, reload, usage, sim)."""
