import sys

from trio_gateway.sim.cli import sim_main

raise SystemExit(sim_main(sys.argv[1:]))
