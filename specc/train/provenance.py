"""What a training stage records about how it ran: the command line (with the thread variables),
for the data cards and ``training.json``. Library code imports this; the CLI never is."""
from __future__ import annotations

import os
import pathlib
import shlex
import sys


def command_line() -> str:
    """This process's command line, with the thread variables it ran under (for the records)."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ)
    argv = ["specc"] + sys.argv[1:] if pathlib.Path(sys.argv[0]).name in ("specc", "cli.py", "__main__.py") \
        else ["python"] + sys.argv
    return (env + " " if env else "") + " ".join(shlex.quote(a) for a in argv)
