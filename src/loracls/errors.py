"""The one error type a user sees: a single line, no traceback, non-zero exit."""


class LoraclsError(Exception):
    """Bad input or a refused setup. The CLI prints `loracls: <message>` and exits with code 2."""
