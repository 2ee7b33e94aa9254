"""The README's example runs as written."""
import pathlib
import re


def test_readme_example_runs(capsys):
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "(8, 1024)" in out and "rms_norm+mul" in out
