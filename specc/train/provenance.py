"""What a training stage records about how it ran: the command line (with the thread variables),
for the data cards and ``training.json``. Library code imports this; the CLI never is."""
from __future__ import annotations

import os
import pathlib
import shlex
import sys


REPO = pathlib.Path(__file__).resolve().parents[2]


def portable(arg: str) -> str:
    """A command-line argument as the committed records write it: an absolute path (alone or after
    ``name=``) inside the repository becomes repository-relative, one under the home directory
    ``~/...``, any other ``.../<last component>`` (a machine's own directory: scratch output, a
    temporary copy). Anything else is returned unchanged."""
    head, eq, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
    if not value.startswith("/"):
        return arg
    path = pathlib.Path(value)
    for root, prefix in ((REPO, ""), (pathlib.Path.home(), "~/")):
        if path.is_relative_to(root) and path != root:
            return head + eq + prefix + str(path.relative_to(root))
    return head + eq + ".../" + path.name


def command_line() -> str:
    """This process's command line, with the thread variables it ran under (for the records), each
    path argument made :func:`portable`."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ)
    argv = ["specc"] + sys.argv[1:] if pathlib.Path(sys.argv[0]).name in ("specc", "cli.py", "__main__.py") \
        else ["python"] + sys.argv
    return (env + " " if env else "") + " ".join(_quote(portable(a)) for a in argv)


def _quote(arg: str) -> str:
    """``shlex.quote``, leaving a leading ``~/`` outside the quotes so the shell still expands it."""
    return "~/" + shlex.quote(arg[2:]) if arg.startswith("~/") else shlex.quote(arg)
