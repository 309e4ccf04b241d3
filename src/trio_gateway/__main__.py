import sys

from trio_gateway.cli import main

sys.exit(main())
