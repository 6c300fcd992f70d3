"""Hostile model directories and careless flags against ``attnjax import``, in the spirit of the
config fuzz: a generator makes each way a Hugging Face directory can lie (its JSON, its
safetensors headers, its index, its tokenizer, its tensors against its config) from the tiny
fixtures, and every case must end in exit status 2 with one line on stderr, no run directory
and no staging directory left, and no file outside the model directory opened."""

from __future__ import annotations

import json
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from attnjax.pretrained.run import import_run
from helpers import REPO, run_cli, subprocess_env

FIXTURES = REPO / "tests" / "data" / "hf"
OPENED: list[str] = []          # every path Python opened while ``watching`` is on
WATCHING = [False]


def _audit(event, args):
    if WATCHING[0] and event == "open" and isinstance(args[0], str | bytes):
        OPENED.append(str(args[0]))


sys.addaudithook(_audit)


# ----------------------------------------------------------------- editing a model directory

def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def config(**changes):
    return lambda d: edit_json(d / "config.json", lambda c: c.update(changes))


def drop_key(key):
    return lambda d: edit_json(d / "config.json", lambda c: c.pop(key))


def read_safetensors(path):
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_safetensors(path, header, data, header_bytes=None):
    encoded = header_bytes if header_bytes is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def header(change, file="model.safetensors"):
    """Edit the header of ``file`` (its tensors' entries by name), data kept."""
    def edit(d):
        entries, data = read_safetensors(d / file)
        change(entries)
        write_safetensors(d / file, entries, data)
    return edit


def first_tensor(entries):
    return next(k for k in entries if k != "__metadata__")


def entry(field, value):
    return header(lambda e: e[first_tensor(e)].update({field: value}))


def raw_header(text: bytes):
    def edit(d):
        _, data = read_safetensors(d / "model.safetensors")
        write_safetensors(d / "model.safetensors", None, data, header_bytes=text)
    return edit


def truncate(file, keep):
    def edit(d):
        raw = (d / file).read_bytes()
        (d / file).write_bytes(raw[:keep(len(raw))])
    return edit


def overlap(entries):
    a, b = [k for k in entries if k != "__metadata__"][:2]
    size = entries[a]["data_offsets"][1] - entries[a]["data_offsets"][0]
    if entries[b]["data_offsets"][1] - entries[b]["data_offsets"][0] == size:
        entries[b]["data_offsets"] = list(entries[a]["data_offsets"])
    else:
        entries[a]["data_offsets"][1] = entries[a]["data_offsets"][0] + size
        entries[b]["data_offsets"][0] = entries[a]["data_offsets"][0]
        entries[b]["dtype"], entries[b]["shape"] = entries[a]["dtype"], entries[a]["shape"]
        entries[b]["data_offsets"][1] = entries[b]["data_offsets"][0] + size


def extra_tensor(d):
    entries, data = read_safetensors(d / "model.safetensors")
    entries["model.layers.0.mlp.extra.weight"] = {"dtype": "F32", "shape": [4],
                                                  "data_offsets": [len(data), len(data) + 16]}
    write_safetensors(d / "model.safetensors", entries, data + bytes(16))


def integer_tensor(d):
    entries, data = read_safetensors(d / "model.safetensors")
    entries["model.norm.weight"]["dtype"] = "I16"          # same byte size as F16
    write_safetensors(d / "model.safetensors", entries, data)


def index(change):
    return lambda d: edit_json(d / "model.safetensors.index.json", change)


def shard_outside(name_of):
    """The index names a shard outside the directory (``name_of(outside path)``)."""
    def edit(d):
        outside = d.parent / "outside.safetensors"
        shutil.copyfile(d / "model-00001-of-00005.safetensors", outside)
        index(lambda i: i["weight_map"].update({"transformer.wte.weight": name_of(outside)}))(d)
    return edit


def in_two_shards(d):
    entries, data = read_safetensors(d / "model-00005-of-00005.safetensors")
    first, _ = read_safetensors(d / "model-00001-of-00005.safetensors")
    name = first_tensor(first)
    entries[name] = dict(first[name], data_offsets=[len(data), len(data) + first[name][
        "data_offsets"][1] - first[name]["data_offsets"][0]])
    write_safetensors(d / "model-00005-of-00005.safetensors", entries,
                      data + bytes(entries[name]["data_offsets"][1] - len(data)))


def text(file, content: bytes):
    return lambda d: (d / file).write_bytes(content)


def sparse(file, size):
    def edit(d):
        with open(d / file, "r+b") as f:
            f.truncate(size)
    return edit


def empty_vocabulary(d):
    edit_json(d / "tokenizer.json", lambda t: (t["model"].update(vocab={}, merges=[]),
                                               t.update(added_tokens=[])))


NESTED = b"[" * 100_000 + b"]" * 100_000

# (id, fixture, edit of the copied directory, fragment of the one line)
CASES = [
    # config.json
    ("config-not-json", "llama", text("config.json", b"{not json"), "is not valid JSON"),
    ("config-not-utf8", "llama", text("config.json", b'{"a": "\xff"}'), "is not UTF-8"),
    ("config-a-list", "llama", text("config.json", b"[1, 2]"), "not an object"),
    ("config-nested", "llama", text("config.json", NESTED), "config.json"),
    ("config-too-large", "llama", sparse("config.json", (64 << 20) + 1), "more than"),
    ("config-model-type-list", "llama", config(model_type=["llama"]), "model_type=['llama']"),
    ("config-missing-key", "gpt2", drop_key("n_embd"), "config.json has no n_embd"),
    ("config-string-number", "gpt2", config(n_head="x"), "n_head='x' is not an integer"),
    ("config-float-integer", "llama", config(num_hidden_layers=1.5), "num_hidden_layers=1.5"),
    ("config-negative", "llama", config(hidden_size=-32), "hidden_size=-32"),
    ("config-zero-heads", "llama", config(num_attention_heads=0), "num_attention_heads=0"),
    ("config-bad-epsilon", "llama", config(rms_norm_eps="x"), "rms_norm_eps='x'"),
    ("config-bad-theta", "llama", config(rope_parameters={"rope_theta": float("inf")}),
     "rope_parameters.rope_theta=inf"),
    ("config-rope-scaling-list", "llama3", config(rope_scaling=[1]), "rope_scaling is a list"),
    ("config-rope-factor-missing", "llama3",
     lambda d: edit_json(d / "config.json", lambda c: (c.get("rope_scaling") or c.get(
         "rope_parameters")).pop("factor")), "factor"),
    ("config-architectures-string", "bert", config(architectures="BertModel"),
     "architectures='BertModel'"),
    ("config-bias-string", "llama", config(attention_bias="yes"), "attention_bias='yes'"),
    ("config-null-flags", "llama", config(attention_bias=None, mlp_bias=None,
                                          tie_word_embeddings=None), None),
    ("config-whole-floats", "llama", config(max_position_embeddings=64.0, hidden_size=32.0),
     None),
    ("config-indivisible", "gpt2", config(n_head=3),
     "config.json describes a model attnjax refuses: model.d_model=32 is not divisible"),
    # the tensors against config.json
    ("shape-positions", "gpt2", config(n_positions=32), "'transformer.wpe.weight' gives"),
    ("shape-mlp", "llama", config(intermediate_size=48), "mlp"),
    ("shape-types", "bert_mlm", config(type_vocab_size=3), "token_type_embeddings.weight"),
    ("shape-heads", "llama", config(num_attention_heads=8),
     "'model.layers.0.self_attn.q_proj.weight' gives"),
    ("shape-width", "llama", config(hidden_size=30, head_dim=None), "'model.embed_tokens.weight' "
     "gives embed/embedding the shape (300, 32), but config.json's model needs (300, 30)"),
    ("shape-vocabulary", "llama", config(vocab_size=301), "embed_tokens.weight"),
    ("shape-layers", "qwen2", config(num_hidden_layers=1), "does not read"),
    ("tensor-missing", "llama", config(num_hidden_layers=3), "has no tensor"),
    ("tensor-unread", "llama", extra_tensor, "does not read, e.g. 'model.layers.0.mlp.extra"),
    ("tensor-integer", "llama", integer_tensor, "'model.norm.weight' is int16; supported: float32"),
    # safetensors headers
    ("file-empty", "llama", text("model.safetensors", b""), "not a safetensors file"),
    ("file-truncated", "llama", truncate("model.safetensors", lambda n: n // 2),
     "outside the file's"),
    ("header-length-lies", "llama", lambda d: (d / "model.safetensors").write_bytes(
        struct.pack("<Q", 1 << 40) + b"{}"), "not a safetensors file"),
    ("header-not-json", "llama", raw_header(b"{nope" + b" " * 8), "model.safetensors"),
    ("header-nested", "llama", raw_header(NESTED), "nested too deeply"),
    ("header-a-list", "llama", raw_header(b"[]"), "not a JSON object"),
    ("header-unknown-dtype", "llama", entry("dtype", "F8_E9M0"), "has dtype 'F8_E9M0'"),
    ("header-shape-string", "llama", entry("shape", "big"), "not a list of sizes"),
    ("header-shape-negative", "llama", entry("shape", [-1, 4]), "not a list of sizes"),
    ("header-shape-overflow", "llama", entry("shape", [1 << 62, 1 << 62]), "span"),
    ("header-offsets-outside", "llama", entry("data_offsets", [0, 1 << 50]),
     "outside the file's"),
    ("header-offsets-reversed", "llama", entry("data_offsets", [64, 0]), "outside the file's"),
    ("header-overlap", "llama", header(overlap), "overlap"),
    ("header-dtype-list", "llama", entry("dtype", ["F32"]), "has dtype ['F32']"),
    ("tensor-flattened", "llama", header(lambda e: e["model.layers.0.self_attn.q_proj.weight"]
                                         .update(shape=[32 * 32])),
     "last read: 'model.layers.0.self_attn.q_proj.weight' of shape [1024]"),
    # sharded index
    ("index-dotdot", "gpt2", shard_outside(lambda p: f"../{p.name}"), "is not a path inside"),
    ("index-absolute", "gpt2", shard_outside(str), "is not a path inside"),
    ("index-passwd", "gpt2", index(lambda i: i["weight_map"].update(x="/etc/passwd")),
     "is not a path inside"),
    ("index-not-a-map", "gpt2", index(lambda i: i.update(weight_map=[1])), "weight_map"),
    ("index-number-name", "gpt2", index(lambda i: i["weight_map"].update(x=3)),
     "is not a path inside"),
    ("index-two-shards", "gpt2", in_two_shards, "is in two files"),
    ("index-shard-missing", "gpt2", index(lambda i: i["weight_map"].update(x="gone.safetensors")),
     "lists gone.safetensors, which is missing"),
    # tokenizer.json
    ("tokenizer-not-json", "llama", text("tokenizer.json", b"{]"), "tokenizer.json"),
    ("tokenizer-wrong-shape", "llama", text("tokenizer.json", b'{"model": 3}'),
     "tokenizer.json"),
    ("tokenizer-too-large", "llama", sparse("tokenizer.json", (256 << 20) + 1), "more than"),
    ("tokenizer-empty-vocabulary", "gpt2", empty_vocabulary, "empty vocabulary"),
    ("tokenizer-a-directory", "llama", lambda d: ((d / "tokenizer.json").unlink(),
                                                 (d / "tokenizer.json").mkdir()), None),
]


def _case_directory(tmp_path, fixture, edit):
    directory = tmp_path / "model" / fixture
    shutil.copytree(FIXTURES / fixture, directory)
    edit(directory)
    return directory


@pytest.mark.parametrize("name, fixture, edit, fragment", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_model_directory_is_one_line_and_leaves_nothing(tmp_path, capsys, name,
                                                                   fixture, edit, fragment):
    directory = _case_directory(tmp_path, fixture, edit)
    workdir = tmp_path / "runs" / "imported"
    workdir.parent.mkdir()
    OPENED.clear()
    WATCHING[0] = True
    try:
        code, out, err = run_cli(capsys, "import", str(directory), "--workdir", str(workdir))
    finally:
        WATCHING[0] = False
    if fragment is None:           # what a real directory may say: imported
        assert code == 0, err
        return
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.startswith("attnjax: error: "), err
    assert fragment in err, err
    assert list(workdir.parent.iterdir()) == []            # no run, no staging directory
    outside = [p for p in OPENED if p.startswith(str(tmp_path))
               and not p.startswith(str(tmp_path / "model" / fixture))]
    assert outside == [], outside


@pytest.mark.parametrize("flags, fragment", [
    (["model.num_layers=1"], "model.num_layers=1 change the model's parameters"),
    (["model.d_model=64"], "model.d_model=64 change the model's parameters"),
    (["model.attention.num_kv_heads=1"], "change the model's parameters"),
    (["data.lenght=3"], "data.lenght"),
])
def test_overrides_that_change_the_checkpoints_model_are_refused(tmp_path, capsys, flags,
                                                                fragment):
    workdir = tmp_path / "run"
    code, out, err = run_cli(capsys, "import", str(FIXTURES / "llama"), "--workdir",
                             str(workdir), *flags)
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not workdir.exists() and list(tmp_path.iterdir()) == []


def test_a_workdir_under_a_file_or_existing_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    for workdir, fragment in ((tmp_path / "file" / "run", "file' is a file, not a directory"),
                              (tmp_path, "exists")):
        code, out, err = run_cli(capsys, "import", str(FIXTURES / "llama"), "--workdir",
                                 str(workdir))
        assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]



# A process importing the llama fixture that stops inside the staging directory, after the
# tokenizer and config are written, until a signal comes: what each signal leaves behind. It
# waits in short sleeps: a signal another thread of the process receives is handled by the
# main thread only when it next runs Python, which one long sleep would put off to its end.
# It takes Ctrl-C as a foreground process does: a process inherits SIGINT ignored or blocked
# from what started it (a shell's background job ignores it, and so do its children), and
# then rightly goes on: the test must not depend on how the suite was started.
HELD_IMPORT = """
import signal, sys, time
from pathlib import Path
from attnjax import checkpoint, cli
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
def held(self, *args, **kwargs):
    Path(sys.argv[2]).write_text("staging")
    for _ in range(1200):
        time.sleep(0.05)
checkpoint.Checkpoints.save_params = held
sys.exit(cli.main(["import", sys.argv[1], "--workdir", sys.argv[3]]))
"""


@pytest.mark.trains
def test_signals_during_an_import_leave_nothing_and_say_so(tmp_path, capsys):
    processes = {}
    for name in ("SIGTERM", "SIGINT", "SIGKILL"):
        ready, workdir = tmp_path / f"{name}.ready", tmp_path / name / "run"
        workdir.parent.mkdir()
        processes[name] = (ready, workdir, subprocess.Popen(
            [sys.executable, "-c", HELD_IMPORT, str(FIXTURES / "llama"), str(ready),
             str(workdir)], env=subprocess_env(), stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 120
    for name, (ready, workdir, process) in processes.items():
        while not ready.exists():
            assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
            time.sleep(0.05)
        staged = [p.name for p in workdir.parent.iterdir()]
        assert len(staged) == 1 and staged[0].startswith(".importing-run-"), staged
        process.send_signal(getattr(signal, name))
    for name, (_, workdir, process) in processes.items():
        err = process.communicate(timeout=60)[1]
        if name == "SIGKILL":
            assert process.returncode == -signal.SIGKILL
            assert len(list(workdir.parent.iterdir())) == 1          # what no finally survives
            code, _, err = run_cli(capsys, "import", str(FIXTURES / "llama"), "--workdir",
                                   str(workdir))
            assert code == 0 and [p.name for p in workdir.parent.iterdir()] == ["run"], err
            continue
        assert process.returncode == 130, err
        assert err == (f"attnjax: interrupted{' (signal SIGTERM)' * (name == 'SIGTERM')}; "
                       "nothing half-written is kept: rerun the same command to go on (a run "
                       "resumes from its last checkpoint)\n")
        assert list(workdir.parent.iterdir()) == []


@pytest.fixture(scope="module")
def imported_run(tmp_path_factory):
    """The llama fixture imported as a run (no training, nothing compiled)."""
    workdir = tmp_path_factory.mktemp("hostile") / "llama"
    import_run(FIXTURES / "llama", workdir)
    return workdir


@pytest.mark.parametrize("argv, fragment", [
    (["eval", "{run}", "model.d_model=64"], "model.d_model=64 change the model's parameters"),
    (["eval", "{run}", "model.num_layers=1"], "block_1"),
    (["attention", "{run}", "--out", "{tmp}/out", "model.attention.num_heads=2"],
     "change the model's parameters"),
    (["eval", "{run}", "data.path=/dev/zero"], "data.path='/dev/zero' is neither a regular file"),
    (["eval", "{run}", "data.tokenizer={tmp}/garbage.json"], "garbage.json"),
])
def test_careless_flags_on_a_run_are_one_line_before_compiling(imported_run, tmp_path, capsys,
                                                                argv, fragment):
    (tmp_path / "garbage.json").write_text("{\"model\": 3}")
    argv = [a.format(run=imported_run, tmp=tmp_path) for a in argv]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "out").exists()
