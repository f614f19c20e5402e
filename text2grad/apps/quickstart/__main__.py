import sys

from text2grad.apps.quickstart.pipeline import main

if __name__ == "__main__":
    sys.exit(main())
