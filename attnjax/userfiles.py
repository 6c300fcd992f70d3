"""Reading the files a user hands attnjax (a model directory's JSON, its tokenizer, the header
of a safetensors file, a run's records): each is checked to be a regular file no larger than a
bound before a byte is parsed, and every way it can be wrong (too large, a device or a
directory, not UTF-8, not JSON, nested past the parser's depth, refused by the library that
parses it) is one ``ValueError`` line naming the file, so that the command line shows that
line instead of a traceback.

Bounds: a JSON record or config is at most ``JSON_LIMIT`` bytes (a Hugging Face config.json or
index is a few kB to a few MB); a tokenizer.json at most ``TOKENIZER_LIMIT`` (the largest in
common use are tens of MB).
"""

from __future__ import annotations

import contextlib
import json
import stat
from pathlib import Path

JSON_LIMIT = 64 << 20
TOKENIZER_LIMIT = 256 << 20


def checked_size(path: str | Path, limit: int) -> int:
    """The size in bytes of the regular file ``path``; a one-line ValueError if it is not a
    regular file (a device such as /dev/zero, a FIFO, a directory) or is larger than
    ``limit`` bytes."""
    path = Path(path)
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is not a regular file")
    size = path.stat().st_size
    if size > limit:
        raise ValueError(f"{path} is {size:,} bytes, more than the {limit:,} such a file may "
                         "have")
    return size


@contextlib.contextmanager
def parsing(path: str | Path):
    """Around the one call that parses ``path`` (a library's reader): whatever it raises
    becomes one ValueError line naming the file (its message's first line). Wrap nothing else,
    so that a bug of attnjax's own still shows its traceback."""
    try:
        yield
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to parse") from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # the library's own types (a Rust panic is a BaseException)
        message = str(error).strip().splitlines()
        raise ValueError(f"{path}: {message[0] if message else type(error).__name__}") from None


def read_json(path: str | Path, limit: int = JSON_LIMIT) -> dict:
    """The JSON object in the file ``path`` (at most ``limit`` bytes); one line naming the file
    if it is too large, not UTF-8, not JSON, or not an object."""
    path = Path(path)
    checked_size(path, limit)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg}, line {error.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to parse") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data
