"""OpenMP's idle threads sleep where other programs keep the machine busy (environment.choose_wait_policy),
chosen by the command line before torch loads libgomp, and never over the user's own setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from neutronorch import environment
from neutronorch.cli import main


@pytest.fixture
def unset(monkeypatch):
    for name in (*environment.WAIT_VARIABLES, "WORLD_SIZE"):  # set, then removed: restored as it was after the test
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("busy, chosen", [(0.0, None), (0.4, None), (0.5, "PASSIVE"), (1.9, "PASSIVE"),
                                          (None, None)])
def test_idle_threads_sleep_only_where_other_programs_keep_half_a_core_busy(unset, busy, chosen):
    unset.setattr(environment, "busy_cores", lambda: busy)
    note = environment.choose_wait_policy()
    assert os.environ.get("OMP_WAIT_POLICY") == chosen and (note is None) == (chosen is None)
    if chosen:
        assert note.startswith(f"other programs keep {busy:.1f} of the machine's") and "OMP_WAIT_POLICY=PASSIVE" in note


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "300000"),
                                         ("WORLD_SIZE", "2")])
def test_the_users_setting_and_launched_ranks_are_left_alone(unset, name, value):
    unset.setenv(name, value)
    unset.setattr(environment, "busy_cores", lambda: 2.0)
    assert environment.choose_wait_policy() is None
    assert os.environ.get("OMP_WAIT_POLICY") == (value if name == "OMP_WAIT_POLICY" else None)


def test_busy_cores_reads_the_machine_and_a_busy_program_counts():
    idle = environment.busy_cores(0.3)
    assert idle is None or 0 <= idle <= os.cpu_count()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = environment.busy_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    if busy is not None:  # /proc/stat is there (Linux): the spinning program is most of a core
        assert busy >= 0.5


def test_the_command_line_chooses_before_a_command_that_computes_and_says_so(unset, capsys):
    unset.setattr(environment, "busy_cores", lambda: 1.5)
    main(["info", "synthetic:nodes=300"])  # reads a graph: nothing chosen
    assert "OMP_WAIT_POLICY" not in os.environ and "idle OpenMP threads sleep" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["predict", "--help"])  # a command that computes (here it only shows its help)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "note: other programs keep 1.5 of the machine's" in capsys.readouterr().err
