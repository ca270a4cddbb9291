import sys

from drift.cli import main

sys.exit(main())
