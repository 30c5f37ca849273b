import sys

from rlwatch.cli import main

sys.exit(main())
