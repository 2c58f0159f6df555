"""A kill during the Trainer's checkpoint write must not leave a checkpoint that resume then crashes on."""
from posttrain.checkpoints import last_complete_checkpoint


def test_a_checkpoint_without_its_trainer_state_is_skipped(tmp_path):
    for step in (10, 20, 30):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text('{"global_step": 20}')
    # checkpoint-30: killed after the weights, before the state (the CI failure of stop 11)
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")
    # killed while writing the state itself: a truncated JSON is not complete either
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text('{"global_st')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text('{"global_step": 30}')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert last_complete_checkpoint(tmp_path / "missing") is None
    (tmp_path / "checkpoint-5").mkdir()
    assert last_complete_checkpoint(tmp_path) is None
