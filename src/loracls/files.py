"""Reading and writing files: every write is atomic (temp file + rename, so nothing is ever half-written)
and keeps the permissions the user's umask asks for; text is read as UTF-8 with one clear line otherwise;
JSON is written strictly (NaN or Infinity is refused: they make a file invalid JSON)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loracls.errors import LoraclsError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_file_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plain open() would respect the umask
    return Path(tmp)


# what writers say when the disk is full or read-only but raise no OSError: safetensors (Rust's io::Error)
# and torch.save (the zip writer's "file write failed")
_FULL_HINTS = (
    "no space left",
    "os error 28",
    "code: 28",
    "storagefull",
    "file write failed",
    "quota exceeded",
    "unexpected pos",  # torch.save's zip writer on a full disk: "[enforce fail at inline_container.cc] unexpected pos"
)
FULL_BYTES = 1 << 20  # a mount with less free space than this, after a failed write, is taken as full


def _nearly_full(path: Path) -> bool:
    """Whether the mount holding `path` has (almost) no space left: a writer library that words a full disk
    its own way (torch's zip writer, a C extension) is still told apart from its other errors."""
    try:
        stats = os.statvfs(_mount_point(path.parent))
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < FULL_BYTES


_READ_ONLY_HINTS = ("read-only file system", "os error 30", "code: 30")


def _mount_point(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _disk_refusal(exc: BaseException, path: Path, what: str | None) -> LoraclsError | None:
    """One line for a write the machine refused (full disk, quota, read-only, no permission), else None."""
    code = exc.errno if isinstance(exc, OSError) else None
    text = str(exc).lower()
    writing_what = f"{what} ({path})" if what else str(path)
    full = code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or any(hint in text for hint in _FULL_HINTS)
    if full or (code is None and _nearly_full(path)):
        return LoraclsError(
            f"no space left on {_mount_point(path.parent)} while writing {writing_what}; free "
            f"some space and run again (an interrupted train continues with --resume)"
        )
    if code == errno.EROFS or any(hint in text for hint in _READ_ONLY_HINTS):
        return LoraclsError(f"read-only file system at {_mount_point(path.parent)} while writing {writing_what}")
    if isinstance(exc, OSError) and code is not None:
        return LoraclsError(f"cannot write {writing_what}: {exc.strerror or exc}")
    return None


@contextmanager
def writing(path: Path, what: str | None = None) -> Iterator[None]:
    """Around any write to `path`: a full or read-only disk becomes one line naming `path` and what was being
    written (never the hidden temp file, never a writer library's internal message)."""
    try:
        yield
    except LoraclsError:
        raise
    except Exception as exc:
        refusal = _disk_refusal(exc, Path(path), what)
        if refusal is None:
            raise
        raise refusal from None


def write_file_atomically(path: Path, fill: Callable[[Path], None], what: str | None = None) -> None:
    """`fill(temp_path)` writes the content; the temp file then replaces `path` in one rename."""
    path = Path(path)
    with writing(path, what):
        tmp = _temp_file_beside(path)
        try:
            fill(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    write_file_atomically(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def json_line(data, indent: int | None = None) -> str:
    """JSON text without NaN / Infinity (refused with one line: such a file would not be valid JSON)."""
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False, indent=indent)
    except ValueError:
        raise LoraclsError(
            f"refusing to write a non-finite number (NaN or Infinity) into JSON: {_first_non_finite(data)}"
        ) from None


def _first_non_finite(data, where: str = "") -> str:
    if isinstance(data, float) and not math.isfinite(data):
        return f"{where or 'value'} = {data}"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else []
    for key, value in items:
        found = _first_non_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return ""


def write_json(path: Path, data) -> None:
    write_text(path, json_line(data, indent=2) + "\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json_line(row) + "\n" for row in rows))


def append_jsonl(path: Path, row: dict) -> None:
    line = json_line(row) + "\n"  # checked before the file is touched
    with writing(path), open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def _apply_umask(directory: Path) -> None:
    """Give everything under `directory` the umask's permissions: mkdtemp makes 0700, and some writers
    (safetensors) make their files 0600 whatever the umask."""
    mask = _umask()
    os.chmod(directory, 0o777 & ~mask)
    for root, folders, names in os.walk(directory):
        for folder in folders:
            os.chmod(Path(root) / folder, 0o777 & ~mask)
        for name in names:
            path = Path(root) / name
            if not path.is_symlink():
                os.chmod(path, 0o666 & ~mask)


def replace_dir(target: Path, fill: Callable[[Path], None], what: str | None = None) -> None:
    """Write a directory through `fill(staging_path)` and swap it in whole."""
    with writing(target, what):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        old = target.with_name(f".{target.name}.old")
        try:
            fill(staging)
            _apply_umask(staging)
            if target.exists():
                os.replace(target, old)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)


# the temp names `write_file_atomically` (mkstemp) and `replace_dir` (mkdtemp, and its `.NAME.old`) give
_LEFTOVER = re.compile(r"\..+\.([a-z0-9_]{8}|old)")


def remove_leftovers(directory: Path) -> list[Path]:
    """Delete the temp files and staging folders a killed writer left in `directory`; returns what went."""
    removed = []
    for path in Path(directory).glob(".*"):
        if _LEFTOVER.fullmatch(path.name):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def read_text(path: Path, what: str = "file") -> str:
    """A text file as UTF-8 (a BOM is dropped); anything else is one line naming the offending byte."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LoraclsError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise LoraclsError(f"{what} {path} is a directory, not a file") from None
    except OSError as exc:
        raise LoraclsError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LoraclsError(
            f"{what} {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def read_json(path: Path, what: str = "file"):
    """Strict JSON (NaN / Infinity refused) from a UTF-8 file, or one line saying what is wrong."""
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise LoraclsError(f"{what} {path} is not valid JSON ({exc})") from None


def read_jsonl(path: Path, what: str = "file") -> list[dict]:
    rows = []
    for number, line in enumerate(read_text(path, what).splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line, parse_constant=_refuse_constant))
            except ValueError as exc:
                raise LoraclsError(f"{what} {path} line {number} is not valid JSON ({exc})") from None
    return rows


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first `keep` lines (a resumed run drops what was logged after its checkpoint)."""
    if path.is_file():
        lines = read_text(path).splitlines(keepends=True)
        write_text(path, "".join(lines[:keep]))


class Busy(LoraclsError):
    """Another live process holds the lock (its PID is in the message)."""


@contextmanager
def exclusive(lock_path: Path, wait: bool = False, what: str = "this folder") -> Iterator[None]:
    """An advisory lock (`fcntl.flock`) held for the block. `wait=False` refuses at once, naming the PID that
    holds it; a lock left by a dead process is free (the kernel drops a flock when its process ends)."""
    import fcntl

    lock_path = Path(lock_path)
    with writing(lock_path, "the lock file"):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise Busy(
                f"{what} is in use by another loracls process (PID {holder}); wait for it to end or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
