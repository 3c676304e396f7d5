import sys

from .driver import startup

startup.mark("python")  # the interpreter is up; everything before this is Python's own start

from .cli import main  # noqa: E402

sys.exit(main())
