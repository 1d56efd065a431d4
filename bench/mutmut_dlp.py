"""Mutation testing of gateway/dlp.py: a uniform sample of mutants, the DLP tests.

Run: `.venv/bin/python bench/mutmut_dlp.py [SAMPLE] [SEED]` (defaults 250 and 15). It
copies the committed tree (`git archive HEAD`) to a temporary directory, so the checkout
and its pyproject.toml are left alone, adds mutmut's configuration there, lets mutmut
3.8.1 generate every mutant of gateway/dlp.py, runs a uniform random sample of them
against the focused DLP tests, and prints the killed share and the survivors with their
diffs. Timeouts count as killed (the mutant made a test hang: a test caught it).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/test_dlp.py",
    "tests/test_dlp_scan.py",
    "tests/test_dlp_precision.py",
    "tests/test_dlp_held_credentials.py",
]
# the pipeline test (a database, an upstream) and the CPU-time one are left out
DESELECT = "not masks_a_short_credential_echoed and not costs_little_cpu"
CONFIG = f"""
[tool.mutmut]
source_paths = ["gateway/"]
only_mutate = ["gateway/dlp.py"]
also_copy = ["tests/", "eai/", "tenants/", "approvals/", "contracts/", "locale/", "templates/",
             "manage.py"]
pytest_add_cli_args_test_selection = {json.dumps([*TESTS, "-k", DESELECT])}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]
# a mutant that loops for ever is a timeout (caught) after 3x the tests' time, not 30x
timeout_multiplier = 1.5
"""


def main(sample_size: int = 250, seed: int = 15) -> int:
    work = Path(tempfile.mkdtemp(prefix="eai-mutmut-dlp-"))
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    (work / ".venv").symlink_to((ROOT / ".venv").resolve())
    with (work / "pyproject.toml").open("a") as f:
        f.write(CONFIG)
    mutmut = str(work / ".venv" / "bin" / "mutmut")
    # A filter matching nothing: mutmut generates the mutants and stops.
    subprocess.run([mutmut, "run", "no-such-mutant"], cwd=work, capture_output=True)
    meta = json.loads((work / "mutants" / "gateway" / "dlp.py.meta").read_text())
    names = sorted(meta["exit_code_by_key"])
    sample = sorted(random.Random(seed).sample(names, min(sample_size, len(names))))
    print(f"{len(names)} mutants of gateway/dlp.py, a sample of {len(sample)} (seed {seed})")
    subprocess.run([mutmut, "run", "--max-children", "2", *sample], cwd=work, capture_output=True)
    results = subprocess.run(
        [mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True
    ).stdout
    status = {}
    for line in results.splitlines():
        name, _, verdict = line.strip().partition(": ")
        status[name] = verdict
    caught = [n for n in sample if status.get(n) in ("killed", "timeout")]
    survivors = [n for n in sample if n not in caught]
    print(f"killed {len(caught)} of {len(sample)}: {100 * len(caught) / len(sample):.1f} %")
    for name in survivors:
        diff = subprocess.run(
            [mutmut, "show", name], cwd=work, capture_output=True, text=True
        ).stdout
        changed = [line for line in diff.splitlines() if line[:2] in ("- ", "+ ")]
        print(f"\n{status.get(name)}: {name}\n" + "\n".join(changed))
    print(f"\n(mutants and results in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))
