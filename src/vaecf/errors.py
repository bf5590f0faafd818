"""The one exception type a user sees."""


class VaecfError(Exception):
    """An error the user can act on.

    Stages print it as a single line (``vaecf <stage>: error: <message>``) and exit with
    status 1, so the message must name what was wrong and where (file, column, row, URI).
    """
