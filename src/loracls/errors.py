"""The one error type a user sees: a single line, no traceback, non-zero exit; and how a message echoes a
value (`shown`) and how long it may be (`capped`)."""

import reprlib
import unicodedata
from typing import Protocol


class Log(Protocol):
    """Where a stage says what it did: one line a call (`print` at the command line, the run's logger in a job,
    `quiet` where nothing should be said)."""

    def __call__(self, message: str, /) -> None: ...


def quiet(message: str, /) -> None:
    """A Log that says nothing (every process but the first; a load whose lines were already said)."""


class LoraclsError(Exception):
    """Bad input or a refused setup. The CLI prints `loracls: <message>` and exits with code 2."""


class CutNotHere(LoraclsError):
    """A request asked a run to cut its texts another way than it can (HTTP 422 naming the field)."""


class NoTokens(LoraclsError):
    """A text the run's tokenizer turns into no tokens (e.g. only characters its normalizer drops): the model
    would read nothing. Refused at every entry: train, predict, evaluate, distill, and HTTP 422 when served."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


SHOWN_CHARACTERS = 200  # the most of one value a message echoes
MESSAGE_CHARACTERS = 1000  # the most of any message the CLI prints (the error formatter's cap)


_BOUNDED = reprlib.Repr()  # Python 3.11 takes no keyword arguments here
_BOUNDED.maxlevel, _BOUNDED.maxtuple, _BOUNDED.maxlist, _BOUNDED.maxdict, _BOUNDED.maxset = 3, 6, 6, 6, 6
_BOUNDED.maxstring, _BOUNDED.maxother, _BOUNDED.maxlong = 120, 80, 60
_KINDS = {str: "a text", bytes: "bytes", list: "a list", tuple: "a tuple", dict: "a mapping", set: "a set"}


def shown(value) -> str:
    """A value as a message echoes it, built without ever writing the whole value out (reprlib): its repr when
    short, else its type and size and how it starts ("a list of 387,420,489 items: [[[...], ...], ...]"), at
    most about SHOWN_CHARACTERS characters, so that no message grows with the input."""
    text = _BOUNDED.repr(value)
    kind = _KINDS.get(type(value))
    if kind is not None and ("..." in text or len(text) > SHOWN_CHARACTERS):
        unit = "characters" if isinstance(value, (str, bytes)) else "items"
        return f"{kind} of {len(value):,} {unit}: {text[:SHOWN_CHARACTERS]}"
    return text[:SHOWN_CHARACTERS]


def capped(message: str) -> str:
    """One line of at most MESSAGE_CHARACTERS characters (the error formatter: whatever a message echoes)."""
    line = " ".join(message.split("\n"))
    return (
        line
        if len(line) <= MESSAGE_CHARACTERS
        else line[: MESSAGE_CHARACTERS - 40] + f" ... ({len(line):,} characters)"
    )


def hidden_character(text: str) -> str | None:
    """The first control (a newline, NUL) or invisible formatting character (a bidi override such as U+202E,
    a zero-width space) in `text`, as "U+XXXX (NAME)"; None where there is none. Names shown to people
    (labels, run folders) must not hold one: it breaks a table's rows or makes a name print as another."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf"):
            return f"U+{ord(ch):04X} ({unicodedata.name(ch, 'a control character')})"
    return None
