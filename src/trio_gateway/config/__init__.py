"""gateway.toml: the schema, its strict loading and semantic checks, and reload planning (which
changes apply live). Imports core, redis.url and the simulator's own config schema."""
