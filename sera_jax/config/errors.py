"""``UserError``: a mistake a user can make or a state a user can fix (a missing path, a locked run directory, a
torn checkpoint), raised anywhere below the commands. Every command reports it as one line, ``error: …``, exit 2,
with no traceback (``sera_jax.cli.common.user_errors``); any other exception is a defect and keeps its traceback.
"""


class UserError(Exception):
    """An error the user can fix; its message is the whole report (it names the file, and the line if any)."""


class MissingPath(UserError, FileNotFoundError):
    """A path the user gave does not exist (still a FileNotFoundError for code that catches those)."""
