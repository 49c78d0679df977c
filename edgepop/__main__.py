import sys

from edgepop.cli import main

sys.exit(main())
