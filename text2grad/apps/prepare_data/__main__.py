import sys

from text2grad.apps.prepare_data.cli import main

sys.exit(main())
