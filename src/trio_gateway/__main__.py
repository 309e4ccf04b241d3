import sys

from trio_gateway.cli.main import main

sys.exit(main())
