"""Tests for attnjax.config: construction, JSON round-trip, dotted overrides, errors."""

import dataclasses
import json
import re
import types
import typing

import jax.monitoring
import pytest

from attnjax import KERNELS, POSITIONS  # importing attnjax registers kernels and encodings
from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig, apply_overrides, from_dict, from_json, to_dict, to_json)
from helpers import raises_one_line


def _override_error(items, *fragments):
    return raises_one_line(lambda: apply_overrides(Config(), items), *fragments)


# --------------------------------------------------------------------------- construction


def test_defaults_construct():
    config = Config()
    assert config.seed == 0
    assert isinstance(config.model, ModelConfig)
    assert isinstance(config.model.attention, AttentionConfig)
    assert isinstance(config.model.position, PositionConfig)
    assert config.model.attention.kernel in KERNELS
    assert config.model.position.kind in POSITIONS
    assert config.model.head_dim == config.model.d_model // config.model.attention.num_heads
    assert config.model.attention.kv_heads == config.model.attention.num_heads
    assert ModelConfig() == Config().model


def test_int_given_for_float_is_converted():
    att = AttentionConfig(scale_multiplier=2)
    assert att.scale_multiplier == 2.0 and isinstance(att.scale_multiplier, float)


NON_DEFAULT = [
    Config(seed=7),
    Config(model=ModelConfig(d_model=64, num_layers=3, mlp="swiglu", mlp_ratio=2.5,
                             norm="rms", norm_position="post", tie_embeddings=False,
                             residual_dropout=0.125, dtype="bfloat16")),
    Config(model=ModelConfig(attention=AttentionConfig(
        num_heads=8, num_kv_heads=2, kernel="chunked", block_q=16, block_k=32,
        fused_qkv=False, use_bias=True, qk_norm="rms", scale="learned",
        scale_multiplier=0.3, logit_soft_cap=30.5, sink="learned",
        dropout="probs_per_head", dropout_rate=0.1, window=7))),
    Config(model=ModelConfig(position=PositionConfig(
        kind="rope", rope_base=500000.0, rope_fraction=0.5, rope_scaling="yarn",
        rope_scale=4.0, train_length=64)), seed=3),
    Config(model=ModelConfig(position=PositionConfig(kind="t5", t5_num_buckets=16,
                                                     t5_max_distance=64))),
    Config(model=ModelConfig(max_length=32, position=PositionConfig(
        kind="learned", learned_interpolate=True)), data=DataConfig(length=32)),
    Config(data=DataConfig(task="copy", length=64, eval_lengths=(128, 256), vocab_size=32,
                           val_fraction=0.25),
           train=TrainConfig(steps=10, batch_size=8, grad_accum=2, learning_rate=3e-4,
                             clip_norm=None)),
    Config(model=ModelConfig(attention=AttentionConfig(kernel="linear"),
                             position=PositionConfig(kind="none"))),
    Config(model=ModelConfig(mlp="gelu_exact", mlp_hidden=300, mlp_bias=False, norm_eps=1e-12)),
]


@pytest.mark.parametrize("config", NON_DEFAULT, ids=lambda c: f"seed{c.seed}")
def test_json_round_trip(config):
    text = to_json(config)
    json.loads(text)  # valid JSON
    back = from_json(Config, text)
    assert back == config
    assert type(back.data.eval_lengths) is tuple
    assert type(back.model.attention.scale_multiplier) is float
    assert to_json(back) == text
    assert from_dict(Config, to_dict(config)) == config


def test_json_round_trip_keeps_none_and_floats():
    config = Config(model=ModelConfig(attention=AttentionConfig(
        num_kv_heads=None, window=None, logit_soft_cap=None, scale_multiplier=0.1)))
    data = json.loads(to_json(config))
    assert data["model"]["attention"]["window"] is None
    assert data["model"]["attention"]["num_kv_heads"] is None
    assert data["model"]["attention"]["scale_multiplier"] == 0.1
    assert from_json(Config, to_json(config)) == config


def test_from_dict_unknown_nested_key():
    raises_one_line(lambda: from_dict(Config, {"model": {"attention": {"num_head": 4}}}),
                     "model.attention.num_head", "num_heads", "num_kv_heads")


# --------------------------------------------------------------------------- overrides


def test_overrides_list_of_strings():
    base = Config()
    new = apply_overrides(base, [
        "model.attention.num_heads=8", "model.position.rope_fraction=0.5",
        "model.attention.window=None", "seed=3", "model.attention.scale_multiplier=0.5",
        "model.tie_embeddings=false", "model.attention.logit_soft_cap=null",
        "model.position.rope_base=500000", "model.attention.kernel=chunked"])
    assert new.model.attention.num_heads == 8
    assert new.model.position.rope_fraction == 0.5
    assert new.model.attention.window is None
    assert new.seed == 3
    assert new.model.attention.scale_multiplier == 0.5
    assert new.model.tie_embeddings is False
    assert new.model.attention.logit_soft_cap is None
    assert new.model.position.rope_base == 500000.0
    assert isinstance(new.model.position.rope_base, float)
    assert new.model.attention.kernel == "chunked"
    # Everything else untouched, and the original is unchanged.
    assert new.model.d_model == base.model.d_model
    assert new.model.attention.qk_norm == base.model.attention.qk_norm
    assert base == Config()
    assert base.model.attention.num_heads == 4 and base.seed == 0
    assert new is not base
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.seed = 4  # type: ignore[misc]


def test_overrides_dict():
    base = Config(model=ModelConfig(attention=AttentionConfig(window=5)))
    new = apply_overrides(base, {"model.attention.num_heads": 8, "model.attention.window": None,
                                 "model.position.kind": "alibi", "seed": 3,
                                 "model.attention.scale_multiplier": 0.5,
                                 "model.tie_embeddings": False})
    assert (new.model.attention.num_heads, new.model.attention.window, new.seed) == (8, None, 3)
    assert new.model.position.kind == "alibi"
    assert new.model.attention.scale_multiplier == 0.5
    assert new.model.tie_embeddings is False
    assert base.model.attention.window == 5 and base.model.attention.num_heads == 4
    assert base.seed == 0 and base.model.tie_embeddings is True


def test_overrides_equal_direct_construction():
    new = apply_overrides(Config(), ["model.d_model=64", "model.attention.num_kv_heads=2",
                                     "model.attention.qk_norm=rms", "model.mlp=swiglu"])
    expected = Config(model=ModelConfig(d_model=64, mlp="swiglu", attention=AttentionConfig(
        num_kv_heads=2, qk_norm="rms")))
    assert new == expected


def test_overrides_empty_is_equal_copy():
    base = Config(seed=5)
    assert apply_overrides(base, []) == base
    assert apply_overrides(base, {}) == base


def test_overrides_value_with_equals_sign_kept():
    # Only the first '=' splits; a string value may contain '='. kind 'a=b' is not valid.
    _override_error(["model.position.kind=a=b"], "model.position.kind", "'a=b'")


# --------------------------------------------------------------------------- errors


def test_unknown_override_key_lists_fields():
    message = _override_error(["model.attention.num_head=4"], "num_head", "model.attention")
    valid = [f.name for f in dataclasses.fields(AttentionConfig)]
    for name in valid:
        assert name in message


def test_unknown_override_key_dict():
    _override_error({"model.d_modle": 64}, "d_modle", "d_model", "num_layers")


def test_unknown_section():
    _override_error(["optimizer.lr=0.1"], "optimizer", "model", "seed")
    _override_error(["model.attn.num_heads=2"], "attn", "attention", "position")


@pytest.mark.parametrize("item, shown", [
    ("model.d_model=abc", "'abc'"),
    ("model.d_model=1.5", "1.5"),
    ("model.d_model=true", "True"),
    ("seed=false", "False"),
    ("model.attention.window=2.0", "2.0"),
    ("model.attention.scale_multiplier=true", "True"),
    ("model.attention.scale_multiplier=fast", "'fast'"),
    ("model.tie_embeddings=1", "1"),
    ("model.mlp_bias=0", "0"),
    ("model.mlp_hidden=100.0", "100.0"),
    ("model.attention.kernel=3", "3"),
])
def test_wrong_type(item, shown):
    field = item.split("=")[0]
    _override_error([item], field, shown)


def test_wrong_type_direct_construction():
    raises_one_line(lambda: ModelConfig(d_model=1.5), "model.d_model", "int")
    raises_one_line(lambda: ModelConfig(num_layers=True), "model.num_layers", "int")
    raises_one_line(lambda: AttentionConfig(num_heads="4"), "model.attention.num_heads")
    raises_one_line(lambda: ModelConfig(attention=3), "model.attention")


def test_unknown_kernel_lists_kernels():
    message = _override_error(["model.attention.kernel=sparse"], "model.attention.kernel",
                              "'sparse'")
    for name in ("reference", "chunked", "xla", "cudnn", "linear"):
        assert name in message
    for name in KERNELS.names():
        assert name in message


def test_unknown_position_kind_lists_all():
    message = _override_error(["model.position.kind=xpos"], "model.position.kind", "'xpos'")
    for name in POSITIONS.names():
        assert name in message
    for name in ("none", "sinusoidal", "learned", "rope", "alibi", "t5"):
        assert name in message


@pytest.mark.parametrize("item, choices", [
    ("model.mlp=relu", ("gelu", "gelu_exact", "swiglu")),
    ("model.norm=batch", ("layer", "rms")),
    ("model.norm_position=middle", ("pre", "post")),
    ("model.dtype=float64", ("float32", "bfloat16", "float16")),
    ("model.attention.qk_norm=l2", ("none", "rms", "layer")),
    ("model.attention.scale=sqrt", ("inv_sqrt_d", "inv_d", "constant", "learned")),
    ("model.attention.sink=zero", ("none", "learned", "plus_one")),
    ("model.attention.dropout=attn", ("none", "probs_shared", "probs_per_head", "output")),
    ("model.position.rope_scaling=xpos", ("default", "linear", "ntk", "dynamic_ntk", "yarn",
                                          "llama3")),
])
def test_literal_bad_value_lists_choices(item, choices):
    field, value = item.split("=")
    _override_error([item], field, repr(value), *choices)


def test_d_model_not_divisible_by_heads():
    _override_error(["model.d_model=130"], "model.d_model", "130", "num_heads", "4")
    raises_one_line(lambda: ModelConfig(d_model=32, attention=AttentionConfig(num_heads=5)),
                     "model.d_model", "5")


def test_heads_not_divisible_by_kv_heads():
    _override_error(["model.attention.num_kv_heads=3"], "model.attention.num_kv_heads", "3")
    raises_one_line(lambda: AttentionConfig(num_heads=4, num_kv_heads=0),
                     "model.attention.num_kv_heads")


@pytest.mark.parametrize("placement", ["probs_shared", "probs_per_head", "output"])
def test_dropout_placement_with_zero_rate(placement):
    _override_error([f"model.attention.dropout={placement}"], "model.attention.dropout_rate",
                    placement)


@pytest.mark.parametrize("items", [["model.attention.dropout_rate=1.0"],
                                   ["model.attention.dropout_rate=-0.1"],
                                   ["model.residual_dropout=1.5"]])
def test_rates_out_of_range(items):
    _override_error(items, items[0].split("=")[0])


@pytest.mark.parametrize("items, option", [
    (["model.attention.kernel=xla", "model.attention.dropout=probs_shared",
      "model.attention.dropout_rate=0.1"], "dropout"),
    (["model.attention.kernel=xla", "model.attention.dropout=probs_per_head",
      "model.attention.dropout_rate=0.1"], "dropout"),
    (["model.attention.kernel=xla", "model.attention.logit_soft_cap=30.0"], "softcap"),
    (["model.attention.kernel=xla", "model.attention.sink=learned"], "sink"),
    (["model.attention.kernel=xla", "model.attention.sink=plus_one"], "sink"),
    (["model.attention.kernel=linear", "model.position.kind=alibi"], "bias"),
    (["model.attention.kernel=linear", "model.position.kind=t5"], "bias"),
    (["model.attention.kernel=linear", "model.attention.window=4"], "window"),
    (["model.attention.kernel=linear", "model.attention.sink=learned"], "sink"),
])
def test_kernel_cannot_honour_option(items, option):
    kernel = items[0].split("=")[1]
    message = _override_error(items, "model.attention.kernel", repr(kernel), option)
    able = [name for name, spec in KERNELS.items() if option in spec.supports]
    assert able, option
    listed = message.split(option, 1)[1]
    for name in able:
        assert re.search(rf"\b{name}\b", listed), (name, message)
    assert not re.search(rf"\b{kernel}\b", listed), message


def test_output_dropout_allowed_with_xla():
    # Output dropout is outside the kernel, so every kernel can honour it.
    config = apply_overrides(Config(), ["model.attention.kernel=xla",
                                        "model.attention.dropout=output",
                                        "model.attention.dropout_rate=0.1"])
    assert config.model.attention.dropout == "output"


def test_rope_fraction_too_small():
    # head_dim 8 with rope_fraction 0.2 leaves floor(1.6) = 1 -> 0 rotary dims.
    raises_one_line(lambda: ModelConfig(d_model=32, attention=AttentionConfig(num_heads=4),
                                         position=PositionConfig(rope_fraction=0.2)),
                     "model.position.rope_fraction", "0.2")
    # The same fraction is fine when the head is wide enough.
    ModelConfig(d_model=128, attention=AttentionConfig(num_heads=4),
                position=PositionConfig(rope_fraction=0.2))


def test_rope_fraction_out_of_range():
    _override_error(["model.position.rope_fraction=0"], "model.position.rope_fraction")
    _override_error(["model.position.rope_fraction=1.5"], "model.position.rope_fraction")


def test_override_item_without_equals():
    _override_error(["seed"], "'seed'", "KEY=VALUE")
    _override_error(["model.d_model=64", "model.attention.num_heads 8"],
                    "model.attention.num_heads 8")


def test_sinusoidal_needs_even_width_at_config_time():
    # Sinusoidal embeddings interleave sin/cos over d_model features, so an odd d_model is an
    # impossible combination; it must be refused when the config is built, not at trace time.
    raises_one_line(lambda: ModelConfig(d_model=33, attention=AttentionConfig(num_heads=3),
                                         position=PositionConfig(kind="sinusoidal")),
                     "model.d_model")


# --------------------------------------------------------------------------- frozen, eager


def test_frozen():
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.d_model = 64  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.attention.num_heads = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.position.kind = "alibi"  # type: ignore[misc]
    assert config == Config()
    assert hash(config) == hash(Config())


BAD_CONSTRUCTIONS = [
    lambda: ModelConfig(d_model=130),
    lambda: AttentionConfig(num_heads=4, num_kv_heads=3),
    lambda: AttentionConfig(kernel="sparse"),
    lambda: PositionConfig(kind="xpos"),
    lambda: AttentionConfig(dropout="probs_shared"),
    lambda: ModelConfig(attention=AttentionConfig(kernel="xla", logit_soft_cap=30.0)),
    lambda: ModelConfig(attention=AttentionConfig(kernel="linear"),
                        position=PositionConfig(kind="alibi")),
    lambda: ModelConfig(d_model=32, position=PositionConfig(rope_fraction=0.2)),
]


def test_errors_raised_before_any_compilation():
    events = []

    def listener(name, *args, **kwargs):
        events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for build in BAD_CONSTRUCTIONS:
            with pytest.raises(ValueError):
                build()
        # Valid configs that exercise every check path also compile nothing.
        ModelConfig(attention=AttentionConfig(scale="learned", sink="learned",
                                              dropout="probs_shared", dropout_rate=0.1,
                                              window=3, logit_soft_cap=5.0))
        compiles = [e for e in events if e.startswith("/jax/core/compile")]
        assert not compiles, compiles
        # Positive control: the listener does see a fresh compilation.
        import jax.numpy as jnp
        jax.jit(lambda x: x * 3.0 - 0.25)(jnp.arange(5.0)).block_until_ready()
        assert any(e.startswith("/jax/core/compile") for e in events)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# ------------------------------------------------------------- ranges and kind-only fields

CLASSES = {"": Config, "model": ModelConfig, "model.attention": AttentionConfig,
           "model.position": PositionConfig, "data": DataConfig, "train": TrainConfig}


def _out_of_range(field: dataclasses.Field, hint) -> list:
    """Values just outside a field's declared range (and non-finite ones for floats, and
    for integers, ones far past int32)."""
    ge, gt, le, lt = field.metadata["range"]
    step = 0.5 if hint is float else 1
    bad = [b for b in (None if ge is None else ge - step, gt, le if le is None else le + step, lt)
           if b is not None]
    if hint is int:     # far past int32, as JAX holds them: issue 26's seed and step count
        bad += [2**32, 10**12] + ([-10**12] if ge < 0 else [])
    return bad + ([float("inf"), float("nan")] if hint is float else [])


def _numeric_fields():
    for prefix, cls in CLASSES.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            hint = hints[field.name]
            if typing.get_origin(hint) in (typing.Union, types.UnionType):   # X | None
                (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
            if typing.get_origin(hint) is tuple:        # a list of numbers; knockout's
                hint = typing.get_args(hint)[0]         # [layer, head] pairs are tested above
            if hint in (int, float):
                yield f"{prefix}.{field.name}" if prefix else field.name, field, hint


NUMERIC = list(_numeric_fields())


def test_every_numeric_field_declares_its_range():
    unbounded = [path for path, field, _ in NUMERIC if "range" not in field.metadata]
    # a regulariser's coefficient of either sign means something: any finite value
    assert unbounded == ["train.entropy_reg", "train.weight_std_reg",
                         "train.sharpen_reg"], unbounded
    assert len(NUMERIC) > 40


def test_every_integer_field_fits_the_int32_jax_holds_it_in():
    """Seeds, step counters, token ids and positions are int32 in JAX: an integer field's
    range ends at 2^31 - 1, a length's (or a shift of the causal diagonal's) at 2^30, so a
    position plus a shift is still an int32."""
    for path, field, hint in NUMERIC:
        if hint is int:
            ge, gt, le, lt = field.metadata["range"]
            high = le if lt is None else lt - 1
            assert ge is not None and high is not None, path
            assert -2**30 <= ge and high <= 2**31 - 1, path


@pytest.mark.parametrize("path, field, hint", NUMERIC, ids=[p for p, _, _ in NUMERIC])
def test_values_outside_a_fields_range_are_refused_naming_it(path, field, hint):
    bad = (_out_of_range(field, hint) if "range" in field.metadata
           else [float("inf"), float("nan")])
    assert bad
    default = dataclasses.MISSING if field.default is dataclasses.MISSING else field.default
    for value in bad:
        value = [value] if isinstance(default, tuple) else value
        message = _override_error({path: value}, path)
        # the field's own check (type, finiteness, range) answers first, not a later one
        assert re.match(rf"{re.escape(path)}(\[0\])? must be ", message), message


@pytest.mark.parametrize("items, field, owner", [
    (["model.attention.dropout_rate=0.3"], "model.attention.dropout_rate", "dropout="),
    (["model.position.kind=alibi", "model.position.rope_scaling=yarn"],
     "model.position.rope_scaling", "kind='rope'"),
    (["model.attention.qk_kappa=10"], "model.attention.qk_kappa", "qk_norm='kappa'"),
    (["model.attention.kernel=xla", "model.attention.block_q=64"], "model.attention.block_q",
     "kernel='chunked'"),
    (["model.position.kind=rope", "model.position.learned_interpolate=true"],
     "model.position.learned_interpolate", "kind='learned'"),
    (["model.position.kind=rope", "model.position.t5_num_buckets=16"],
     "model.position.t5_num_buckets", "kind='t5'"),
    (["model.position.rope_scale=4"], "model.position.rope_scale", "rope_scaling="),
    (["model.position.rope_scaling=linear", "model.position.train_length=64"],
     "model.position.train_length", "'yarn'"),
])
def test_a_setting_that_means_nothing_for_the_kind_is_refused(items, field, owner):
    message = _override_error(items, field, "means nothing", owner)
    assert message.startswith(field), message
    # with the kind that reads it, the same setting is accepted
    readers = {"model.attention.dropout_rate": ["model.attention.dropout=output"],
               "model.position.rope_scaling": ["model.position.kind=rope"],
               "model.attention.qk_kappa": ["model.attention.qk_norm=kappa"],
               "model.attention.block_q": ["model.attention.kernel=chunked"],
               "model.position.learned_interpolate": ["model.position.kind=learned"],
               "model.position.t5_num_buckets": ["model.position.kind=t5"],
               "model.position.rope_scale": ["model.position.rope_scaling=yarn"],
               "model.position.train_length": ["model.position.rope_scaling=yarn"]}
    apply_overrides(Config(), items + readers[field])


def _conditional_fields():
    """``(dotted field, its When)`` of every field declared with ``read_when``."""
    for prefix, cls in CLASSES.items():
        for field in dataclasses.fields(cls):
            if "read_when" in field.metadata:
                yield (f"{prefix}.{field.name}" if prefix else field.name,
                       field.metadata["read_when"])


CONDITIONAL = list(_conditional_fields())
# a value other than the default for each conditional field, and the overrides that put its
# selector on a value that does not read it (and keep the field's own kind one that does)
NON_DEFAULT = {"model.attention.causal": (False, ["model.attention.window=4"]),
               "model.attention.key_padding_mask": (False, []),
               "model.attention.causal_offset": (1, ["model.attention.kernel=masked_fill",
                                                     "model.attention.causal=false"]),
               "model.attention.o_init": ("zeros", ["model.attention.output_projection=frozen"]),
               "model.mlp_ratio": (2.0, ["model.mlp_hidden=64"]),
               "model.position.rope_scale": (2.0, []),
               "model.position.train_length": (16, []),
               "model.position.rope_low_freq_factor": (0.5, []),
               "model.position.rope_high_freq_factor": (8.0, []),
               "data.min_length": (4, []),
               "data.pad_token": (3, []),
               "model.num_classes": (3, ["model.family=encoder", "data.task=mlm",
                                         "model.vocab_size=260"])}
for _name in "qkvo":
    NON_DEFAULT[f"model.attention.{_name}_init_scale"] = (0.5, [])


def test_every_conditional_field_is_covered():
    assert sorted(path for path, _ in CONDITIONAL) == sorted(NON_DEFAULT)


@pytest.mark.parametrize("path, rule", CONDITIONAL, ids=[p for p, _ in CONDITIONAL])
def test_a_conditional_field_set_under_another_selector_value_is_refused(path, rule):
    value, context = NON_DEFAULT[path]
    owner = path.rpartition(".")[0]
    selector = rule.selector if "." in rule.selector else f"{owner}.{rule.selector}"
    chosen = apply_overrides(Config(), context)
    for part in selector.split("."):
        chosen = getattr(chosen, part)
    assert chosen not in rule.values
    readers = " or ".join(map(repr, rule.values))
    message = _override_error(context + [f"{path}={json.dumps(value)}"],
                              f"means nothing with {rule.selector}={chosen!r}",
                              f"it is read by {rule.selector}={readers}")
    assert message.startswith(f"{path}={value!r}"), message


def test_learned_table_evaluated_past_its_rows_fails_at_config_time():
    items = ["model.position.kind=learned", "model.max_length=32", "data.length=32",
             "data.eval_lengths=[32, 64]"]
    _override_error(items, "data.eval_lengths", "64", "model.max_length=32",
                    "learned_interpolate")
    apply_overrides(Config(), items + ["model.position.learned_interpolate=true"])


@pytest.mark.parametrize("train, expected", [
    ({}, 10),                                        # 1000 steps, cadences 50 / 500 / 500
    ({"steps": 20, "log_every": 5, "eval_every": 10, "checkpoint_every": 10}, 5),
    ({"steps": 21, "log_every": 7, "eval_every": 7, "checkpoint_every": 21}, 7),
    ({"steps": 100, "log_every": 3}, 1),
    ({"steps_per_dispatch": 2, "log_every": 4, "eval_every": 4, "checkpoint_every": 4}, 2),
])
def test_steps_per_dispatch_by_default_is_the_most_every_cadence_allows(train, expected):
    config = apply_overrides(Config(), {f"train.{k}": v for k, v in train.items()})
    assert config.train.dispatch_steps() == expected
