"""The command line speaks to researchers: every command, option and positional has a help
line, choices come from the registries, ``--version`` works, and bad input is answered with
exit status 2, all in process (``attnjax.cli.main``). The exact help texts are in
``test_cli_help.py``, the length of the package's functions in ``test_cli_functions.py``."""

import argparse
import sys
from importlib import metadata

import jax

from attnjax import cli
from attnjax.cli import sweep as sweep_commands
from attnjax.registry import KERNELS, LAUNCHERS
from helpers import run_cli


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("attnjax",)):
    """(command path, action) for every option, positional and subcommand under ``parser``,
    except the built-in -h/--help."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:     # the subcommands' own help lines
                yield path + (choice.dest,), choice
            for name, sub in action.choices.items():
                yield from walk(sub, path + (name,))


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_option_and_positional_has_a_help_line():
    parser = cli.build_parser()
    actions = list(walk(parser))
    assert len(actions) > 50
    missing = [" ".join(path) + " " + (action.option_strings or [action.metavar or action.dest])[0]
               for path, action in actions if not (action.help or "").strip()]
    assert not missing, missing
    multiline = [(path, action.help) for path, action in actions if "\n" in action.help]
    assert not multiline, multiline


def test_every_subcommand_has_a_description_and_formats_its_help():
    for name, sub in subparsers(cli.build_parser()).items():
        assert (sub.description or "").strip(), name
        text = sub.format_help()        # expands every %(default)s / %(choices)s
        assert sub.description.split()[0] in text, name


def test_help_is_for_researchers_not_the_developer_docstring(capsys):
    code, out, err = run_cli(capsys, "--help")
    assert code == 0
    assert "parses argv" not in out and "The only module" not in out
    assert "attention" in out and "examples:" in out
    assert "attnjax train experiments/baseline.py --workdir runs/base" in out
    for name in subparsers(cli.build_parser()):
        assert name in out


def test_version(capsys):
    code, out, err = run_cli(capsys, "--version")
    assert code == 0
    assert out.strip() == f"attnjax {metadata.version('attnjax')}"


def test_version_falls_back_to_the_package(monkeypatch):
    import attnjax

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", not_installed)
    assert cli._version() == attnjax.__version__


def test_choices_come_from_the_registries(capsys):
    commands = subparsers(cli.build_parser())
    sweep_help, bench_help = commands["sweep"].format_help(), commands["bench"].format_help()
    assert all(name in sweep_help for name in LAUNCHERS.names())
    assert all(name in bench_help for name in KERNELS.names())
    code, out, err = run_cli(capsys, "sweep", "x.py", "--workdir", "w", "--launcher", "nope")
    assert code == 2 and "invalid choice: 'nope'" in err
    assert all(repr(name) in err for name in LAUNCHERS.names())
    code, out, err = run_cli(capsys, "bench", "attention", "--kernels", "chunked", "nope")
    assert code == 2 and "invalid choice: 'nope'" in err
    assert all(repr(name) in err for name in KERNELS.names())


def test_building_the_parser_imports_nothing_heavy(monkeypatch, capsys):
    def no_import():
        raise AssertionError("a registry was imported to build the parser")
    monkeypatch.setattr(LAUNCHERS, "names", no_import)   # read only for --help / a bad value
    monkeypatch.setattr(KERNELS, "names", no_import)
    assert run_cli(capsys, "--help")[0] == 0
    cli.build_parser().parse_args(["sweep", "x.py", "--workdir", "w"])
    before = set(sys.modules)
    cli.build_parser()
    new = {name for name in set(sys.modules) - before
           if name.split(".")[0] in {"attnjax", "jax", "jaxlib", "flax", "optax", "orbax"}}
    assert not new, sorted(new)


def test_unknown_arguments_and_missing_options_exit_2(capsys):
    code, out, err = run_cli(capsys, "train", "x.py", "--workdir", "w", "--no-such-option")
    assert code == 2 and "unrecognized arguments: --no-such-option" in err
    code, out, err = run_cli(capsys, "train", "x.py")
    assert code == 2 and "--workdir" in err.splitlines()[-1]
    code, out, err = run_cli(capsys)
    assert code == 2 and "COMMAND" in err.splitlines()[-1]


def test_missing_experiment_file_is_one_line(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", str(tmp_path / "none.py"), "--workdir",
                             str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_an_interrupted_command_says_how_to_resume_and_exits_130(monkeypatch, capsys):
    """Ctrl-C (or SIGTERM to a sweep or audit driver, raised as KeyboardInterrupt) ends in one
    line, not a traceback."""
    def interrupted(args):
        raise KeyboardInterrupt("signal SIGTERM")
    monkeypatch.setattr(sweep_commands, "_sweep_status", interrupted)
    code, out, err = run_cli(capsys, "sweep-status", "runs/anything")
    assert code == 130 and out == ""
    assert err == ("attnjax: interrupted (signal SIGTERM); nothing half-written is kept: rerun "
                   "the same command to go on (a run resumes from its last checkpoint)\n")


def test_commands_that_read_a_run_turn_on_the_persistent_compilation_cache(monkeypatch,
                                                                          tmp_path, capsys):
    """A second ``generate``, ``eval`` or ``attention`` on a run loads the programs the first
    compiled: those commands turn on JAX's persistent cache ($ATTNJAX_COMPILE_CACHE) before
    they run (here one refused at once, so nothing compiles)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTNJAX_COMPILE_CACHE", str(cache))
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        code, _, err = run_cli(capsys, "sweep-status", str(tmp_path / "none"))
        assert code == 2 and jax.config.jax_compilation_cache_dir is None, err
        code, _, err = run_cli(capsys, "generate", str(tmp_path / "none"), "--prompt", "a")
        assert code == 2 and jax.config.jax_compilation_cache_dir == str(cache), err
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)
