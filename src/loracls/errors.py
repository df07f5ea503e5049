"""The one error type a user sees: a single line, no traceback, non-zero exit."""


class LoraclsError(Exception):
    """Bad input or a refused setup. The CLI prints `loracls: <message>` and exits with code 2."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
