"""A pretrained model's tokenizer: its ``tokenizer.json`` through the ``tokenizers`` package
(no ``transformers`` at run time). Text goes in as ids, with the file's special-token template
applied when asked (BERT's ``[CLS] ... [SEP]``, Llama's BOS), and comes out as text; each id
has a readable label for plots. Padding and truncation saved in the file are turned off: a
probe is what the text is. ``data.tokenizer`` names one: text data is then its ids, not bytes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from attnjax.userfiles import TOKENIZER_LIMIT, checked_size, parsing


class TextTokenizer:
    """``tokenizer.json`` at ``path``: ``encode``, ``decode``, ``labels``, ``vocab_size``,
    ``special_ids``."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no tokenizer file {str(path)!r}")
        checked_size(path, TOKENIZER_LIMIT)
        with parsing(path):
            self.path, self._tokenizer = path, Tokenizer.from_file(str(path))
        if not self._tokenizer.get_vocab(with_added_tokens=True):
            raise ValueError(f"{path} has an empty vocabulary")
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    @property
    def vocab_size(self) -> int:
        """One more than the largest id it can produce (added tokens included)."""
        return max(self._tokenizer.get_vocab(with_added_tokens=True).values()) + 1

    @property
    def special_ids(self) -> dict[str, int]:
        """The special tokens (``[CLS]``, ``<|endoftext|>``, ...) by their text."""
        return {token.content: id_ for id_, token
                in self._tokenizer.get_added_tokens_decoder().items() if token.special}

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` (a whole token's text, e.g. ``[MASK]``), None if it has none."""
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str, special: bool = True) -> np.ndarray:
        """int32 ids ``[T]`` of ``text``; ``special``: with the special tokens the file's
        template adds (a corpus is encoded without them)."""
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=special).ids, np.int32)

    def decode(self, ids) -> str:
        """The text of ``ids``, special tokens left out."""
        return self._tokenizer.decode([int(i) for i in np.asarray(ids).ravel()])

    def labels(self, ids) -> list[str]:
        """Each id as its own text (a byte-level piece decoded, a WordPiece ``##`` piece as
        written), or, for a special token that decodes to nothing, its name (``[CLS]``)."""
        return [self._tokenizer.decode([int(i)]) or self._tokenizer.id_to_token(int(i))
                or str(int(i)) for i in np.asarray(ids).ravel()]


@functools.lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int) -> TextTokenizer:
    return TextTokenizer(path)


def load_tokenizer(path: str | Path, field: str = "data.tokenizer") -> TextTokenizer:
    """The tokenizer at ``path``, read once per process while the file is unchanged; a missing
    file is one line naming ``field``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{field}={str(path)!r} is not a file (a tokenizer.json)")
    return _cached(str(path.resolve()), path.stat().st_mtime_ns)


def check_vocabulary(tokenizer: TextTokenizer, vocab_size: int) -> None:
    """Refuse, in one line, a tokenizer whose ids a model of ``vocab_size`` rows cannot embed
    (a model may have more rows than the tokenizer has ids, never fewer)."""
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"{tokenizer.path.name} has {tokenizer.vocab_size} ids but the "
                         f"model's vocabulary (model.vocab_size) is {vocab_size}: "
                         "they do not belong together")
