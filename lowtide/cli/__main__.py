import sys

from lowtide.cli import main

sys.exit(main())
