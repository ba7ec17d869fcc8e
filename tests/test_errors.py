"""`envs.errors`: the helpers every one-line message is made with, and the one debug switch."""

from __future__ import annotations

import pytest

from clstm_ppo.cli.main import run_guarded
from envs.errors import DEBUG_ENV, UserError, debug_enabled, describe_exception, first_line, shown_list


def test_shown_list_cuts_long_lists_and_counts_them() -> None:
    assert shown_list(["a", "b", "c"], 3) == "a, b, c"  # nothing left out: no count
    assert shown_list(["a", "b", "c", "d"], 2) == "a, b, ... (4 in all)"
    assert shown_list(range(12), 10, noun="rows") == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (12 rows in all)"
    assert shown_list(["x; 1", "y; 2"], 1, noun="tickers", sep="; ") == "x; 1; ... (2 tickers in all)"
    # only the first items built (a mask over a million rows), the count given
    assert shown_list(["r1", "r2"], 2, noun="rows", total=1_000_000) == "r1, r2, ... (1000000 rows in all)"
    assert shown_list([], 5) == ""


def test_first_line_and_describe_exception() -> None:
    report = ValueError("\n  Error tokenizing data. C error: Expected 3 fields in line 7, saw 5  \nmore\ndetail")
    assert first_line(report) == "Error tokenizing data. C error: Expected 3 fields in line 7, saw 5"
    assert first_line(report, 15) == "Error tokenizin"
    assert first_line("only text") == "only text" and first_line("") == "" and first_line(OSError()) == ""
    assert describe_exception(report, 5) == "ValueError: Error"
    assert describe_exception(KeyError()) == "KeyError"
    assert len(describe_exception(RuntimeError("x" * 1000))) == len("RuntimeError: ") + 300


def test_debug_flag_sets_the_one_variable_workers_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert not debug_enabled()

    def fails(argv: list[str]) -> int:
        assert argv == ["--x"]  # --debug is taken out before the command sees its flags
        assert debug_enabled()
        raise UserError("bad --x")

    assert run_guarded(fails, ["--x", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == "error: bad --x"
    monkeypatch.setenv(DEBUG_ENV, "0")
    assert not debug_enabled()


def test_unexpected_errors_are_one_line_naming_their_type(capsys: pytest.CaptureFixture) -> None:
    def crashes(argv: list[str]) -> int:
        raise ZeroDivisionError("division by zero\n  and a second line")

    assert run_guarded(crashes, []) == 1
    assert capsys.readouterr().err == (
        "error: unexpected ZeroDivisionError: division by zero (--debug shows the traceback)\n"
    )


def test_a_process_command_freezes_its_imports_and_a_test_interpreter_keeps_its_collector() -> None:
    """`freeze_imports`: in the process of one command (``main()`` without arguments, as the console script and
    ``python -m`` call it), the objects its imports made are frozen once they are made, torch's among them (the
    exit then skips them); a command called in this interpreter freezes nothing."""
    import gc
    import subprocess
    import sys

    from clstm_ppo.cli.main import main

    frozen = gc.get_freeze_count()
    assert main(["train", "--preset", "demo", "--dry_run"]) == 0
    assert gc.get_freeze_count() == frozen
    probe = (
        "import gc, sys\n"
        "from clstm_ppo.cli.main import main\n"
        "sys.argv = ['clstm-ppo', 'train', '--preset', 'demo', '--dry_run']\n"
        "code = main()\n"
        "print('frozen', gc.get_freeze_count(), 'tracked', len(gc.get_objects()), 'torch', 'torch' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    words = out.strip().splitlines()[-1].split()
    assert words[0] == "frozen" and words[-1] == "True"
    assert int(words[1]) > 5 * int(words[3])  # the imports' objects (torch's ~170k) frozen, few left to collect
