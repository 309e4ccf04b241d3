"""The running process: serve (one gateway in this process), workers (a supervisor of several),
and the reloader (SIGHUP)."""
