"""A pretrained model's tokenizer: its ``tokenizer.json`` through the ``tokenizers`` package
(no ``transformers`` at run time). Text goes in as ids, with the file's special-token template
applied (BERT's ``[CLS] ... [SEP]``), and comes out as text; each id has a readable label for
plots. Padding and truncation saved in the file are turned off: a probe is what the text is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from attnjax.config import ModelConfig


class TextTokenizer:
    """``tokenizer.json`` at ``path``: ``encode``, ``decode``, ``labels``, ``vocab_size``."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no tokenizer file {str(path)!r}")
        self.path, self._tokenizer = path, Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    @property
    def vocab_size(self) -> int:
        """One more than the largest id it can produce (added tokens included)."""
        return max(self._tokenizer.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, text: str) -> np.ndarray:
        """int32 ids ``[T]`` of ``text``, special tokens as the file's template adds them."""
        return np.asarray(self._tokenizer.encode(text).ids, np.int32)

    def decode(self, ids) -> str:
        """The text of ``ids``, special tokens left out."""
        return self._tokenizer.decode([int(i) for i in np.asarray(ids).ravel()])

    def labels(self, ids) -> list[str]:
        """Each id as its own text (a byte-level piece decoded, a WordPiece ``##`` piece as
        written), or, for a special token that decodes to nothing, its name (``[CLS]``)."""
        return [self._tokenizer.decode([int(i)]) or self._tokenizer.id_to_token(int(i))
                or str(int(i)) for i in np.asarray(ids).ravel()]


def check_vocabulary(tokenizer: TextTokenizer, config: ModelConfig) -> None:
    """Refuse, in one line, a tokenizer whose ids the model's embedding cannot look up (a model
    may have more rows than the tokenizer has ids, never fewer)."""
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{tokenizer.path.name} has {tokenizer.vocab_size} ids but the "
                         f"model's vocabulary (model.vocab_size) is {config.vocab_size}: "
                         "they do not belong together")
