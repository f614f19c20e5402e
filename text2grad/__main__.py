from text2grad.apps.cli import main
from text2grad.core.cli import exit_process

exit_process(main())
