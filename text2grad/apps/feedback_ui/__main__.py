import sys

from text2grad.apps.feedback_ui import main

sys.exit(main())
