"""The command line's parser: list options whose value starts with a negative number."""

import pytest

from neutronorch.cli import build_parser
from neutronorch.config import TrainConfig


@pytest.mark.parametrize("args, field, value", [
    (["--fanouts", "-1,10"], "fanouts", "-1,10"),
    (["--fanouts=-1,10"], "fanouts", "-1,10"),
    (["--fanouts", "-1"], "fanouts", "-1"),
    (["--fanouts", "15,-1,5"], "fanouts", "15,-1,5"),
    (["--eval-fanouts", "-1,-1"], "eval_fanouts", "-1,-1"),
    (["--eval-fanouts", "-1,10", "--eval-every", "-1"], "eval_fanouts", "-1,10"),
])
def test_list_options_take_values_that_start_with_a_negative_number(args, field, value):
    parsed = build_parser().parse_args(["train", *args])
    assert getattr(parsed, field) == value
    TrainConfig(**{k: v for k, v in vars(parsed).items() if k not in ("command", "config")}).validate()


def test_a_negative_fanout_list_is_not_taken_for_a_flag_after_other_options():
    parsed = build_parser().parse_args(["train", "--epochs", "1", "--fanouts", "-1,10", "--hidden", "8"])
    assert (parsed.epochs, parsed.fanouts, parsed.hidden) == (1, "-1,10", 8)


def test_other_options_still_reject_a_missing_value(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--hidden", "--epochs", "1"])
    assert "expected one argument" in capsys.readouterr().err
