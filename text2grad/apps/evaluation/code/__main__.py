"""``python -m text2grad.apps.evaluation.code``."""

import sys

from text2grad.apps.evaluation.code.cli import main

sys.exit(main())
