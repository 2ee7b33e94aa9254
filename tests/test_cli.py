"""The command line: help, info, unknown commands."""
import subprocess
import sys

from gg.__main__ import main


def test_help(capsys):
    assert main([]) == 0
    assert "demo" in capsys.readouterr().out


def test_unknown_command(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_info_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "gg", "info"], capture_output=True, text=True, check=True).stdout
    assert "backend cpu   available" in out
