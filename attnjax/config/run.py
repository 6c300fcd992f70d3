"""What to train on, how to train, and the top-level ``Config`` that holds them with the model."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from attnjax.config.fields import INT32, LENGTH, Validated, choice, number, when
from attnjax.config.kernel import kernel_request
from attnjax.config.mesh import MeshConfig
from attnjax.config.model import PADDED, ModelConfig
from attnjax.registry import KERNELS, MODELS, REGULARIZERS, TASKS


@dataclasses.dataclass(frozen=True)
class DataConfig(Validated):
    """What to train on: ``task`` is a name in ``attnjax.registry.TASKS``. ``text``: bytes of
    ``path`` (a file or directory; ``None`` = the built-in corpus, the interpreter's
    standard-library source); ``tokens``: a flat binary file of token ids; the rest are
    synthetic tasks generated on device. ``tokenizer``: text is that ``tokenizer.json``'s ids
    instead of bytes (an imported model's run has its own)."""
    PATH = "data"
    KINDS = (("task", TASKS, "reads"),)
    task: str = choice("text", TASKS)
    path: str | None = None
    tokenizer: str | None = None      # a tokenizer.json: text is its ids (attnjax.data.tokenizer)
    length: int = number(128, ge=2, le=LENGTH)        # training sequence length
    eval_lengths: tuple[int, ...] = number((), ge=2, le=LENGTH)  # extra evaluation lengths
    val_fraction: float = number(0.1, gt=0, lt=1)
    vocab_size: int = number(256, ge=2, le=INT32)    # synthetic tasks and token files
    num_pairs: int = number(8, ge=1, le=INT32)       # mqar key-value pairs
    # mqar's filler, query placement (None: uniform; a: power law) and values (data/synthetic)
    mqar_filler: Literal["zero", "random"] = "zero"
    mqar_query_power: float | None = number(None, gt=0, le=1)
    mqar_distinct_values: bool = False
    token_dtype: Literal["uint16", "uint32", "int32"] = "uint16"
    # text and tokens (attnjax.data.padding): a BOS id before every window; padded examples
    bos_token: int | None = number(None, ge=0, lt=INT32)  # id < model.vocab_size; input only
    padding: Literal["none", *PADDED] = "none"       # where the pads of an example go
    # padded: real lengths in [this, length]; the pad id (None: random tokens)
    min_length: int = number(1, ge=1, le=LENGTH, read_when=when("padding", *PADDED))
    pad_token: int | None = number(0, ge=0, lt=INT32, read_when=when("padding", *PADDED))
    # the encoder's masked-language-model text (attnjax.data.encoder): one segment or a pair
    # per example; the share of tokens chosen, and of those replaced by [MASK] / a random token
    segments: Literal["single", "pair"] = "single"
    mlm_rate: float = number(0.15, gt=0, le=1)
    mlm_mask_share: float = number(0.8, ge=0, le=1)
    mlm_random_share: float = number(0.1, ge=0, le=1)

    def _validate(self):
        TASKS.get(self.task).check(self)
        if self.padding != "none" and self.min_length > min(self.lengths):
            self._fail("min_length", f"={self.min_length} exceeds the shortest length "
                       f"{min(self.lengths)} (data.length, data.eval_lengths)")

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every length the model is trained or evaluated at."""
        return (self.length,) + self.eval_lengths


# the cadences a dispatch of several steps must divide, and the most steps an automatic
# dispatch runs (bench train: 10 steps per dispatch trains 1.1-1.5x faster than 1 on a CPU)
CADENCES = ("log_every", "eval_every", "checkpoint_every")
AUTO_DISPATCH = 10


@dataclasses.dataclass(frozen=True)
class TrainConfig(Validated):
    """Optimisation, evaluation, logging and checkpoint cadence."""
    PATH = "train"
    steps: int = number(1000, ge=1, le=INT32)
    batch_size: int = number(32, ge=1, le=INT32)
    learning_rate: float = number(1e-3, gt=0, argument=1e-3)
    warmup_steps: int = number(100, ge=0, le=INT32, argument=0)
    final_lr_fraction: float = number(0.1, ge=0, le=1)    # cosine decays to this x the peak
    weight_decay: float = number(0.1, ge=0, argument=0.0)  # on matrices only
    b1: float = number(0.9, ge=0, lt=1)
    b2: float = number(0.95, ge=0, lt=1)
    clip_norm: float | None = number(1.0, gt=0)           # None: no clipping
    grad_accum: int = number(1, ge=1, le=INT32)     # micro-batches per update (batch split evenly)
    z_loss: float = number(0.0, ge=0, argument=0.0)  # coefficient of log^2 Z
    # attention regularisers (REGULARIZERS, attnjax.train.regularizers), each a coefficient of
    # any sign
    entropy_reg: float = 0.0                        # mean attention entropy
    weight_std_reg: float = 0.0                     # per-head std of the attention weights
    sharpen_reg: float = 0.0                        # KL to the sharpened attention
    # training steps per compiled call (>1: a lax.scan, batches made on the device; host data
    # is fed one step per call); None: the most, up to AUTO_DISPATCH, that divides steps and
    # the log, evaluation and checkpoint cadences (dispatch_steps)
    steps_per_dispatch: int | None = number(None, ge=1, le=INT32)
    parallel: Literal["mesh", "pmap"] = "mesh"
    # the mesh's axis sizes and sharding rules (attnjax.config.mesh; parallel=mesh only)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    log_every: int = number(50, ge=1, le=INT32)
    eval_every: int = number(500, ge=1, le=INT32)
    eval_batches: int = number(8, ge=1, le=INT32)
    eval_batch_size: int = number(32, ge=1, le=INT32)
    # the attention kernel evaluation runs (None: the model's); kernels compute the same
    # function, so this trades speed and memory (``chunked`` at long lengths), not results
    eval_kernel: str | None = choice(None, KERNELS)
    checkpoint_every: int = number(500, ge=1, le=INT32)
    keep_best: int = number(1, ge=1, le=INT32)      # checkpoints kept by validation loss (+ latest)
    head_metrics: bool = False                      # log per-head attention statistics (log_every)
    # a run directory (an imported model's, say) whose best parameters start training
    init_from: str | None = None

    def _validate(self):
        if self.batch_size % self.grad_accum:
            self._fail("grad_accum", f"={self.grad_accum} must divide batch_size={self.batch_size}")
        if self.parallel == "pmap" and self.mesh.splits_a_run():
            self._fail("parallel", "='pmap' keeps the parameters and sequences whole on every "
                       f"device; train.mesh.fsdp={self.mesh.fsdp}, sequence="
                       f"{self.mesh.sequence} and tensor={self.mesh.tensor} split them: use "
                       "train.parallel=mesh")
        for name in CADENCES if self.steps_per_dispatch is not None else ():
            if getattr(self, name) % self.steps_per_dispatch:
                self._fail(name, f"={getattr(self, name)} must be a multiple of "
                           f"steps_per_dispatch={self.steps_per_dispatch}")

    def dispatch_steps(self) -> int:
        """``steps_per_dispatch``, or by default the most steps up to ``AUTO_DISPATCH`` that
        divide ``steps`` and every cadence (so logs, evaluations, checkpoints and the end fall
        between dispatches): one dispatch per step costs the host's round trip every step."""
        if self.steps_per_dispatch is not None:
            return self.steps_per_dispatch
        period = math.gcd(self.steps, *(getattr(self, name) for name in CADENCES))
        return max(n for n in range(1, AUTO_DISPATCH + 1) if period % n == 0)

    def regularizers(self) -> dict:
        """The attention regularisers (``REGULARIZERS`` entries) whose coefficient is not 0."""
        return {name: reg for name, reg in REGULARIZERS.items()
                if getattr(self, reg.coefficient) != 0.0}


@dataclasses.dataclass(frozen=True)
class Config(Validated):
    """Top-level config: what ``experiments/<name>.py:get_config()`` returns."""
    PATH = ""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    seed: int = number(0, ge=0, le=INT32, argument=0)

    def _validate(self):
        task = TASKS.get(self.data.task)
        objective = MODELS.get(self.model.family).objective(self.model)
        if task.objective != objective:
            tasks = [name for name, t in TASKS.items() if t.objective == objective]
            self._fail("data.task", f"={self.data.task!r} trains {task.objective}, not the "
                       f"{objective} of this model.family={self.model.family!r}; tasks: "
                       f"{', '.join(tasks)}")
        if self.model.vocab_size < task.vocab(self.data):
            self._fail("model.vocab_size", f"={self.model.vocab_size} is smaller than the "
                       f"data's vocabulary ({task.vocab(self.data)})")
        if self.data.length > self.model.max_length:
            self._fail("data.length", f"={self.data.length} exceeds model.max_length="
                       f"{self.model.max_length}")
        self.model.check_lengths(self.data.lengths)
        for name in ("bos_token", "pad_token"):
            token = getattr(self.data, name)
            if token is not None and token >= self.model.vocab_size:
                self._fail(f"data.{name}", f"={token} must be in [0, model.vocab_size="
                           f"{self.model.vocab_size})")
        padded = self.data.padding != "none"
        if padded:
            try:
                kernel_request(self.model, padded=True)
            except ValueError as error:
                self._fail("data.padding", f"={self.data.padding!r} needs per-example positions "
                           f"and a key-padding mask, which {error}")
        if self.train.eval_kernel is not None:
            self._check_eval_kernel(padded)
        self._check_weight_readers(padded)

    def _check_eval_kernel(self, padded: bool):
        exact = [name for name, spec in KERNELS.items() if spec.exact]
        for kernel in (self.train.eval_kernel, self.model.attention.kernel):
            if kernel not in exact:
                self._fail("train.eval_kernel", f"={self.train.eval_kernel!r} needs exact "
                           f"softmax kernels to evaluate the same function, and {kernel!r} "
                           f"is not; exact kernels: {', '.join(exact)}")
        try:
            kernel_request(self.evaluated().model, padded=padded)
        except ValueError as error:
            self._fail("train.eval_kernel", f"={self.train.eval_kernel!r} cannot evaluate "
                       f"this model: {error}")

    def _check_weight_readers(self, padded: bool):
        """Per-head metrics and attention regularisers read every layer's weights."""
        readers = ["head_metrics"] * self.train.head_metrics + [
            reg.coefficient for reg in self.train.regularizers().values()]
        for name in readers:
            try:
                kernel_request(self.model, return_weights=True, padded=padded)
            except ValueError as error:
                self._fail(f"train.{name}", f"needs attention weights, which {error}")

    def evaluated(self) -> Config:
        """The config evaluation runs: the model with ``train.eval_kernel`` when one is set."""
        if self.train.eval_kernel is None:
            return self
        attention = dataclasses.replace(self.model.attention, kernel=self.train.eval_kernel)
        return dataclasses.replace(self, model=dataclasses.replace(self.model, attention=attention),
                                   train=dataclasses.replace(self.train, eval_kernel=None))
