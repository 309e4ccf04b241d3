"""What an operator sees: the access log and its writer, metrics, the status page's numbers,
tracing headers, drain, loop lag and systemd notify. Imports only core."""
