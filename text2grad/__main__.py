import sys

from text2grad.apps.cli import main

sys.exit(main())
