import sys

from simrig.cli import main

sys.exit(main())
