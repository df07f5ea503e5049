import sys

from loracls.cli import main

sys.exit(main())
