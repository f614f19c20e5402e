import sys

from text2grad.cli import main

sys.exit(main())
