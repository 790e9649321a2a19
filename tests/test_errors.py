"""The one base class of fixable errors and the one way a program reports it
(rhhjax/errors.py): one line, ``error:`` and exit status 1; ``warning:`` goes on."""

import subprocess
import sys

from rhhjax.errors import UserError, one_line, warn


def test_one_line_joins_lines_and_unquotes_key_errors():
    assert one_line(UserError("a\n  b\tc")) == "a b c"
    assert one_line(KeyError("missing field")) == "missing field"
    assert one_line("plain") == "plain"
    assert issubclass(UserError, ValueError)


def test_warn_is_one_line_on_stderr(capsys):
    warn("config.json\nis missing")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "warning: config.json is missing\n"


def test_exit_with_error_prints_one_line_and_exits_with_the_code():
    code = (
        "from rhhjax.errors import exit_with_error\n"
        "print('before')\n"
        "exit_with_error('bad\\ninput', 3)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 3
    assert run.stdout == "before\n" and run.stderr == "error: bad input\n"
