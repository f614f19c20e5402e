import sys

from text2grad.apps.prepare_data import main

sys.exit(main())
