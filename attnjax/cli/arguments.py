"""What the commands' parsers share: ``add_command`` (a command with its one-line summary and
its description), the help of config overrides and of ``--checkpoint``, the number types of
options and the checks of their values (``check_range``, ``utf8_text``), and
``RegistryNames``, a registry's names as argparse choices."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

OVERRIDES = "config overrides as dotted KEY=VALUE pairs, e.g. model.position.kind=alibi"
CHECKPOINT = ("which checkpoint to load: best (lowest validation loss) or latest "
              "(default: %(default)s)")


def add_command(commands, name: str, summary: str,
                description: str | None = None) -> argparse.ArgumentParser:
    """The parser of command ``name``: ``summary`` is its line in ``attnjax --help``;
    ``description`` heads its own help (default: the summary as a sentence)."""
    return commands.add_parser(name, help=summary,
                               description=description or summary[0].upper() + summary[1:] + ".")


def add_checkpoint(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint best|latest``, the checkpoint of a run directory a command loads."""
    parser.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                        help=CHECKPOINT)


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def check_range(flag: str, value: int, low: int, high: int) -> None:
    """Refuse ``value`` of option ``flag`` outside ``[low, high]`` in one line."""
    if not low <= value <= high:
        raise ValueError(f"{flag} must be in [{low}, {high}], got {value}")


def utf8_text(flag: str, text: str | None) -> str | None:
    """``text`` of option ``flag`` (None stays None), or a one-line ValueError naming ``flag``
    where it is not UTF-8: argv that is not UTF-8 reaches Python as lone surrogates
    (``surrogateescape``), which neither a tokenizer nor ``str.encode`` takes."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        what = (f"the byte 0x{code - 0xDC00:02x}, not UTF-8" if 0xDC80 <= code <= 0xDCFF
                else f"the lone surrogate U+{code:04X}")
        raise ValueError(f"{flag} must be UTF-8 text; its character {error.start} is {what}"
                         ) from None
    return text


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


class RegistryNames(Sequence):
    """A registry's names, read the first time argparse looks at them (checking a value, or
    formatting --help): the registry then imports its provider, so building the parser does
    not."""

    def __init__(self, registry):
        self._registry = registry

    def __getitem__(self, index):
        return self._registry.names()[index]

    def __len__(self) -> int:
        return len(self._registry.names())
