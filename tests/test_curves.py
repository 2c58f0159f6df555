"""The training-curve files (posttrain/curves.py): one row per logged step from the Trainer's log history, written
as it trains and whole again after a resume."""
from posttrain.curves import curve_csv, read_curve


def test_a_curve_keeps_the_logged_steps_with_a_column_per_key(tmp_path):
    history = [{"step": 1, "loss": 2.0, "rollout/reward_mean": 0.25, "epoch": 0.1},
               {"step": 2, "rollout/reward_mean": 0.5},  # a step that logged no loss
               {"step": 2, "train_loss": 1.5, "train_runtime": 3.0},  # the Trainer's closing summary
               {"epoch": 1.0, "loss": 9.0}]  # no step: not a point of the curve
    text = curve_csv(history, ["loss", "rollout/reward_mean"])
    assert text == "step,loss,rollout_reward_mean\n1,2.0,0.25\n2,,0.5\n"
    (tmp_path / "c.csv").write_text(text)
    curve = read_curve(tmp_path / "c.csv")
    assert curve["step"].tolist() == [1, 2] and curve["loss"].isna().tolist() == [False, True]
    assert read_curve(tmp_path / "absent.csv").empty


def test_the_dev_accuracy_joins_the_steps_it_was_measured_at(tmp_path):
    from types import SimpleNamespace

    from posttrain.curves import TrainingCurve

    dev = SimpleNamespace(history=[(2, 0.5), (3, 0.625)])
    state = SimpleNamespace(is_world_process_zero=True, log_history=[
        {"step": 1, "kl": 0.0}, {"step": 2, "kl": 0.01}, {"step": 3, "kl": 0.02},
        {"step": 3, "train_loss": 0.1}])  # the closing summary at the last step takes no accuracy
    TrainingCurve(tmp_path / "c.csv", ["kl"], dev).on_train_end(None, state, None)
    assert (tmp_path / "c.csv").read_text() == "step,kl,dev_accuracy\n1,0.0,\n2,0.01,0.5\n3,0.02,0.625\n"
