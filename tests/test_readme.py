"""The README's test command is the one CI runs."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    command = ci[-1].strip()
    assert command.startswith("python -m pip install")
    assert command in readme, "the README's test command and .ci/run disagree"


def test_readme_opens_with_two_commands():
    blocks = (ROOT / "README.md").read_text().split("```sh")
    assert len(blocks) >= 3
    assert "colibri-lab run experiments/tour.toml" in blocks[1]
    assert "pytest" in blocks[2]
