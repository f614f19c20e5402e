"""``python -m text2grad.annotate``: the annotation phase's CLI (implemented in annotation/)."""

import sys

from annotation.cli import main

if __name__ == "__main__":
    sys.exit(main())
