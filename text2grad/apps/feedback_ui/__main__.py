import sys

from text2grad.apps.feedback_ui.cli import main

sys.exit(main())
