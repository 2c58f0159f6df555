"""params.yaml validation: one line per bad key, naming the key path, the bad value and the expectation."""
from pathlib import Path

import pytest
import yaml

from posttrain.cli import main as cli
from posttrain.params import ParamsError, load_params, parse_params, with_overrides

ROOT = Path(__file__).resolve().parents[1]


def raw(profile="params.yaml"):
    return yaml.safe_load((ROOT / profile).read_text())


@pytest.mark.parametrize("profile", ["params.yaml", "configs/params.smoke.yaml"])
def test_shipped_profiles_are_valid_and_complete(profile):
    p = load_params(ROOT / profile)
    assert p.task.source == "synthetic" and p.evaluate.models


def test_the_schema_knows_exactly_the_trajectories():
    from posttrain.params_schema import TRAJECTORY_NAMES
    from posttrain.trajectories import TRAJECTORIES

    assert sorted(TRAJECTORY_NAMES) == sorted(t.name for t in TRAJECTORIES)


def test_profiles_have_the_same_keys():
    def keys(d, prefix=""):
        return {prefix + k for k in d} | {x for k, v in d.items() if isinstance(v, dict) for x in keys(v, f"{prefix}{k}.")}
    assert keys(raw()) == keys(raw("configs/params.smoke.yaml"))


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r["warmup"].update(learning_rate="fast"), "params.yaml: warmup.learning_rate: got 'fast', expected a number"),
    (lambda r: r["warmup"].update(lr=0.1), "params.yaml: warmup.lr: unknown key (got 0.1)"),
    (lambda r: r["model"].pop("hidden_size"), "params.yaml: model.hidden_size: missing, expected a value"),
    (lambda r: r.pop("tracking"), "params.yaml: tracking: missing"),
    (lambda r: r["sandbox"].update(workers=[2]), "params.yaml: sandbox.workers: got [2], expected an integer"),
    (lambda r: r["dots_search"].update(keep=[8]), "params.yaml: dots_search: keep has 1 entries, expected one per iteration (2)"),
    (lambda r: r["evaluate"].update(n_test="many"), "params.yaml: evaluate.n_test: got 'many', expected an integer"),
    (lambda r: r["task"].update(source="csv"), "params.yaml: task.source: got 'csv', expected 'synthetic' or 'jsonl'"),
    (lambda r: r["warmup"].update(warmup_ratio=1.5), "params.yaml: warmup.warmup_ratio: got 1.5, expected less than 1"),
    (lambda r: r.update(seed=1.5), "params.yaml: seed: got 1.5, expected an integer"),
    (lambda r: r["judge"].update(faults={"reset": 0.5}), "params.yaml: judge.faults.reset.[key]: got 'reset', "
     "expected 'http_500', 'http_429', 'timeout', 'malformed_json', 'truncated_json', 'no_verdict' or 'connection_reset'"),
    (lambda r: r["judge"].update(faults={"http_500": 0.7, "timeout": 0.7}),
     "params.yaml: judge.faults: each probability must be in [0, 1] and they must sum to at most 1"),
    (lambda r: r["judge"].update(mistake_rate=1.5),
     "params.yaml: judge.mistake_rate: got 1.5, expected less than or equal to 1"),
    (lambda r: r["sft"].update(deepspeed="zero9.json"),
     "params.yaml: sft.deepspeed: 'zero9.json' is not a readable JSON file (FileNotFoundError)"),
    (lambda r: r["model"].update(num_heads=5), "params.yaml: model: num_heads (5) must divide hidden_size"),
    (lambda r: r["task"].update(source="jsonl", jsonl=None), "params.yaml: task: source is jsonl but jsonl is null"),
    # strict types: YAML's quoted numbers and yes/no words are not what the key holds
    (lambda r: r.update(seed=True), "params.yaml: seed: got True, expected an integer"),
    (lambda r: r["warmup"].update(max_steps="1500"), "params.yaml: warmup.max_steps: got '1500', expected an integer"),
    (lambda r: r["evaluate"].update(dots="yes"), "params.yaml: evaluate.dots: got 'yes', expected true or false"),
    (lambda r: r["warmup"].update(warmup_ratio=1.0), "params.yaml: warmup.warmup_ratio: got 1.0, expected less than 1"),
    # list items: a keep of 0 crashed the search after its first chunk; a budget of -0.3 routed 70% of the pairs
    (lambda r: r["dots_search"].update(keep=[8, 0]), "params.yaml: dots_search.keep.1: got 0, expected greater than"),
    (lambda r: r["rlhf"].update(eval_budgets=[0.1, 5]), "params.yaml: rlhf.eval_budgets.1: got 5, expected less than"),
    (lambda r: r["evaluate"].update(formats=["cot", "cto"]), "params.yaml: evaluate.formats: expected distinct names"),
    (lambda r: r["evaluate"].update(formats=["cot", "cot"]), "params.yaml: evaluate.formats: expected distinct names"),
    (lambda r: r["evaluate"].update(formats=[]), "params.yaml: evaluate.formats: expected distinct names"),
    (lambda r: r["evaluate"].update(models=["warmup", "rlhf"]), "params.yaml: evaluate: models, policies and the DOTS"),
    (lambda r: r["evaluate"].update(models=["warmup", "sft_vanilla"]), "params.yaml: evaluate: models, policies and"),
    # non-finite floats: .inf passed gt=0 and the sandbox's read loop died of OverflowError, a NaN weight passed the
    # weights' check and random.choices failed in prepare, neither naming the key
    (lambda r: r["sandbox"].update(wall_seconds=float("inf")),
     "params.yaml: sandbox.wall_seconds: got inf, expected a finite"),
    (lambda r: r["policy_opt"].update(beta=float("inf")), "params.yaml: policy_opt.beta: got inf, expected a finite"),
    (lambda r: r["task"]["kind_weights"].update(chain=float("nan")),
     "params.yaml: task.kind_weights.chain: got nan, expected a finite"),
    (lambda r: r["judge"]["faults"].update(http_500=float("nan")), "params.yaml: judge.faults.http_500: got nan"),
    # DOTS keeps fewer candidates each iteration (N_1 = 8 > N_2 = 3); [3, 8] was accepted
    (lambda r: r["dots_search"].update(keep=[3, 8]), "params.yaml: dots_search.keep: must not increase"),
])
def test_bad_keys_are_named_on_one_line(mutate, expected):
    r = raw()
    mutate(r)
    with pytest.raises(ParamsError) as e:
        parse_params(r)
    lines = str(e.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(expected), lines[0]


def set_dotted(r, dotted, value):
    *parents, leaf = dotted.split(".")
    for key in parents:
        r = r[key]
    r[leaf] = value


# (dotted key, bad value, expected message, other keys the rule needs set): values that passed validation and then
# crashed a stage, or made its result meaningless, after the stages before it had run
LATE_FAILURES = [
    # JudgeClient refused it when rlhf_routed opened the judge (posttrain/judge_client.py:247)
    ("judge.base_url", "127.0.0.1:8000/v1", "judge.base_url: expected an http:// or https:// URL", {}),
    ("judge.base_url", "", "judge.base_url: expected an http:// or https:// URL", {}),
    ("judge.base_url", "http://127.0.0.1:80000/v1", "judge.base_url: expected an http:// or https:// URL", {}),
    # TRL's vLLM client retried a scheme-less address for 240 s, then raised ConnectionError
    ("rlvr.vllm_server_url", "localhost:8000", "rlvr.vllm_server_url: expected an http:// or https:// URL",
     {"rlvr.vllm": "server"}),
    ("rlhf.vllm_server_url", "http:///", "rlhf.vllm_server_url: expected an http:// or https:// URL",
     {"rlhf.vllm": "server"}),
    # zero responses a stage would leave every prompt without a rollout; k = 1 is valid (one response a stage)
    ("rlvr.k", 0, "rlvr.k: got 0, expected greater than or equal to 1", {}),
    # RepeatSampler made no full batch: training stopped at step 0 and saved the SFT policy as models/rlvr
    ("rlvr.n_prompts", 4, "rlvr: prompts_per_step (8) exceeds the training prompts (rlvr.n_prompts: 4)",
     {"rlvr.prompts_per_step": 8}),
    ("prepare.n_train", 6, "rlhf: prompts_per_step (8) exceeds the training prompts (prepare.n_train: 6)",
     {"rlvr.prompts_per_step": 2, "sft.min_examples": 0}),
    # a run resumed between a rollout's num_iterations steps rolled out anew: it trained on other responses
    ("rlvr.save_steps", 41, "rlvr: save_steps (41) must be a multiple of num_iterations (2)", {"rlvr.num_iterations": 2}),
    # stages/sft.py stopped with DataError after the whole DOTS search: it cannot keep more than it searched
    ("sft.min_examples", 241, "sft: min_examples (241) exceeds the questions dots_search searches (240", {}),
    ("sft.min_examples", 31, "sft: min_examples (31) exceeds the questions dots_search searches (30",
     {"prepare.n_train": 30, "dots_search.n_questions": None, "rlhf.prompts_per_step": 2, "rlvr.prompts_per_step": 2}),
    # every pair's uncertainty the same: routing and train_rm's uncertainty figures meaningless (NaN Spearman)
    ("train_rm.dropout", 0.0, "train_rm: estimator mc_dropout needs dropout > 0", {"train_rm.estimator": "mc_dropout"}),
    ("train_rm.uncertainty_lambda", 0.0, "train_rm: uncertainty_score variance needs uncertainty_lambda > 0",
     {"train_rm.uncertainty_score": "variance"}),
    # LlamaConfig: "RoPE requires an even rotary dimension" in base_model
    ("model.hidden_size", 200, "model: hidden_size / num_heads (25) must be even", {"model.num_heads": 8}),
    # vLLM refused it when dots_search opened the engine, after the warm-up
    ("generation.dtype", "bf16", "generation.dtype: got 'bf16', expected 'auto', 'half'", {}),
    # the shards ran one at a time in this process, the cluster unused
    ("evaluate.workers", 0, "evaluate: ray_address is set but workers is 0", {"evaluate.ray_address": "auto"}),
    # evaluate read models/ itself, or a directory outside models/, as a model
    ("evaluate.models", [""], "evaluate.models: expected directories under models/", {}),
    ("evaluate.policies", ["../elsewhere"], "evaluate.policies: expected directories under models/", {}),
    # MLflow took an empty URI as its default store, away from the repository's
    ("tracking.uri", "", "tracking.uri: got '', expected String should have at least 1 character", {}),
    # tenacity waited max_backoff_s from the first retry on
    ("judge.max_backoff_s", 0.1, "judge: max_backoff_s (0.1) is below backoff_s (0.5)", {"judge.backoff_s": 0.5}),
]


@pytest.mark.parametrize("key, bad, expected, context", LATE_FAILURES,
                         ids=[f"{key}={bad!r}" for key, bad, _, _ in LATE_FAILURES])
def test_values_that_would_fail_a_later_stage_are_refused(key, bad, expected, context):
    r = raw()
    for k, v in {**context, key: bad}.items():
        set_dotted(r, k, v)
    with pytest.raises(ParamsError) as e:
        parse_params(r)
    lines = str(e.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"params.yaml: {expected}"), lines[0]


@pytest.mark.parametrize("settings", [
    {"judge.base_url": "https://api.example.com/v1"}, {"judge.base_url": "http://[::1]:8000/v1"},
    {"rlvr.vllm_server_url": "localhost:8000"},  # unread unless rlvr.vllm is server
    {"rlvr.vllm": "server", "rlhf.vllm": "server"},  # the default address
    {"rlvr.k": 2, "rlvr.prompts_per_step": 8, "rlvr.n_prompts": 8},
    {"rlvr.num_iterations": 2, "rlvr.save_steps": 40},
    {"prepare.n_train": 8, "dots_search.n_questions": None, "sft.min_examples": 8, "rlvr.prompts_per_step": 8},
    {"task.source": "jsonl", "task.jsonl": {"train": "a", "dev": "b", "test": "c"}, "prepare.n_train": 1,
     "dots_search.n_questions": None, "sft.min_examples": 10**6},  # a user's files: their size is unknown here
    {"train_rm.estimator": "mc_dropout", "train_rm.uncertainty_lambda": 0.0},
    {"model.hidden_size": 200, "model.num_heads": 4}, {"model.base": "gpt2", "model.hidden_size": 30},
    {"generation.dtype": "bfloat16"}, {"evaluate.workers": 4, "evaluate.ray_address": "ray://head:10001"},
    {"evaluate.models": ["sft_checkpoints/step-100"]}, {"judge.backoff_s": 2.0, "judge.max_backoff_s": 2.0},
])
def test_values_at_the_edge_of_those_rules_are_kept(settings):
    r = raw()
    for k, v in settings.items():
        set_dotted(r, k, v)
    parse_params(r)


def test_keep_may_stay_level():
    r = raw()
    r["dots_search"]["keep"] = [3, 3]
    assert parse_params(r).dots_search.keep == [3, 3]


def test_every_problem_is_reported():
    r = raw()
    r["warmup"]["max_steps"] = "x"
    r["model"]["vocab"] = 3
    with pytest.raises(ParamsError) as e:
        parse_params(r)
    assert len(str(e.value).splitlines()) == 2


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("seed: 1\ntask: [unclosed\n")
    with pytest.raises(ParamsError, match=r"params.yaml:\d+:\d+: not valid YAML"):
        load_params(bad)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ParamsError, match="no such file"):
        load_params(tmp_path / "nope.yaml")
    (tmp_path / "p.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ParamsError, match="expected a mapping"):
        load_params(tmp_path / "p.yaml")


def test_check_params_command(tmp_path, capsys):
    assert cli(["check-params", str(ROOT / "params.yaml")]) == 0
    r = raw()
    r["prepare"]["n_train"] = -1
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(r))
    assert cli(["check-params", str(bad)]) == 2
    assert "prepare.n_train: got -1, expected greater than or equal to 1" in capsys.readouterr().err


def test_overrides_are_validated_and_written(tmp_path):
    out = tmp_path / "params.yaml"
    params = with_overrides(ROOT / "configs/params.smoke.yaml", {"rlhf.budget": 0.2, "seed": 3}, out)
    assert params.rlhf.budget == 0.2 and params.seed == 3
    assert load_params(out).rlhf.budget == 0.2
    with pytest.raises(ParamsError, match="rlhf.budgt"):
        with_overrides(ROOT / "configs/params.smoke.yaml", {"rlhf.budgt": 0.2}, out)
    with pytest.raises(ParamsError, match="budget"):
        with_overrides(ROOT / "configs/params.smoke.yaml", {"rlhf.budget": "lots"}, out)
    assert load_params(out).rlhf.budget == 0.2  # a bad override leaves the file as it was


def test_overrides_change_their_lines_only_and_keep_the_comments(tmp_path):
    """The file was rewritten by yaml.safe_dump: all 68 comment lines (the keys' one-line docs) went."""
    import difflib

    out = tmp_path / "params.yaml"
    with_overrides(ROOT / "params.yaml", {"rlhf.budget": 0.2, "dots_search.keep": [6, 2], "task.jsonl": None}, out)
    changed = [line for line in difflib.unified_diff((ROOT / "params.yaml").read_text().splitlines(),
                                                     out.read_text().splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert sorted(changed) == sorted([
        "-  keep: [8, 3]               # N_1, N_2", "+  keep: [6, 2]               # N_1, N_2",
        *(f"{sign}  budget: {v}                # uncertainty_budget / random: share of each step's non-identical "
          "pairs judged" for sign, v in (("-", 0.1), ("+", 0.2)))]), changed


def test_overrides_without_out_validate_and_write_nothing(tmp_path, monkeypatch):
    base = ROOT / "configs/params.smoke.yaml"
    before = base.read_text()
    monkeypatch.chdir(tmp_path)  # where the default out, params.yaml, would land
    assert with_overrides(base, {"rlhf.budget": 0.064}, out=None).rlhf.budget == 0.064
    with pytest.raises(ParamsError, match="rlhf.budget: got 10"):
        with_overrides(base, {"rlhf.budget": 10}, out=None)
    assert base.read_text() == before and not list(tmp_path.iterdir())


def test_params_are_read_as_dvc_writes_them(tmp_path):
    """`dvc exp run -S` and with_overrides write YAML 1.2 (ruamel): 1e-05 is a number there, and 'on' a string;
    read as YAML 1.1 (PyYAML) they came back as the string '1e-05' (refused by the strict schema) and True."""
    out = tmp_path / "params.yaml"
    params = with_overrides(ROOT / "params.yaml", {"warmup.learning_rate": 1e-05, "tracking.experiment": "on"}, out)
    assert params.warmup.learning_rate == 1e-05 and params.tracking.experiment == "on"
    assert load_params(out).warmup.learning_rate == 1e-05 and load_params(out).tracking.experiment == "on"
    out.write_text(out.read_text().replace("learning_rate: 1e-05", "learning_rate: 5e-5"))  # written by hand
    assert load_params(out).warmup.learning_rate == 5e-5


@pytest.mark.parametrize("content, expected", [
    (None, r"nope\.yaml: no such file"),
    ("", r"p\.yaml: expected a mapping of sections at the top level, got nothing \(the file is empty\)"),
    ("# only a comment\n", r"p\.yaml: expected a mapping .*the file is empty"),
    ("- 1\n- 2\n", r"p\.yaml: expected a mapping of sections at the top level, got a list"),
    ("seed: 1\ntask: [unclosed\n", r"p\.yaml:3:1: not valid YAML"),
    ("seed: 1\nseed: 2\n", r"p\.yaml:2:1: not valid YAML: found duplicate key"),
    ("seed: !!python/object:os.system {}\n", r"p\.yaml:1:7: not valid YAML"),
    (b"seed: 1\n\xff\n", r"p\.yaml:2: not UTF-8 text"),
    ("dir", r"p\.yaml: cannot read it"),
    ("seed: 1" + "0" * 5000 + "\n", r"p\.yaml: not valid YAML: Exceeds the limit \(4300 digits\)"),
], ids=["missing", "empty", "comments-only", "list", "syntax", "duplicate-key", "python-tag", "not-utf8", "directory",
        "huge-integer"])
@pytest.mark.parametrize("read", [load_params, lambda path: with_overrides(path, {"seed": 3}, out=None)],
                         ids=["load_params", "with_overrides"])
def test_an_unusable_params_file_is_a_params_error_naming_it(tmp_path, content, expected, read):
    """with_overrides (a sweep's or profile's base file) raised a bare FileNotFoundError, YAMLError or
    UnicodeDecodeError, or, for a list, named the override as missing; load_params a bare IsADirectoryError."""
    path = tmp_path / ("nope.yaml" if content is None else "p.yaml")
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ParamsError, match=f"^{tmp_path}/{expected}"):
        read(path)


def test_an_override_may_add_a_key_to_a_mapping_parameter():
    """judge.faults.http_500 was refused as 'no parameter' because params.yaml's faults is {}, though `dvc exp run -S`
    sets it and the schema takes it: a sweep over a fault rate could not be written."""
    base = ROOT / "params.yaml"
    assert with_overrides(base, {"judge.faults.http_500": 0.2}, out=None).judge.faults == {"http_500": 0.2}
    with pytest.raises(ParamsError, match=r"judge\.faults\.http_501\.\[key\]: got 'http_501'"):
        with_overrides(base, {"judge.faults.http_501": 0.2}, out=None)
    with pytest.raises(ParamsError, match="no parameter 'budgt'"):  # a section's keys stay fixed
        with_overrides(base, {"rlhf.budgt": 0.2}, out=None)
    with pytest.raises(ParamsError, match="no section 'fault'"):
        with_overrides(base, {"judge.fault.http_500": 0.2}, out=None)


@pytest.mark.parametrize("seed", [-1, 2**32, 20240601123])
def test_a_seed_numpy_cannot_take_is_refused_naming_the_key(seed):
    """transformers.set_seed (numpy) takes 0 to 2**32 - 1: seed -1 or a date-like 20240601123 passed validation and
    prepare, then base_model died of "ValueError: Seed must be between 0 and 2**32 - 1", naming no key."""
    r = raw()
    r["seed"] = seed
    with pytest.raises(ParamsError, match=rf"^params\.yaml: seed: got {seed}, expected"):
        parse_params(r)
    r["seed"] = 2**32 - 1
    assert parse_params(r).seed == 2**32 - 1


@pytest.mark.parametrize("text", ["seed: " + "[" * 5000 + "]" * 5000, "seed: " + "{a: " * 5000 + "1" + "}" * 5000])
def test_yaml_nested_too_deep_is_a_params_error(tmp_path, text):
    """The YAML parser recurses once per level: a deeply nested value ended in a bare RecursionError traceback."""
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError, match=rf"^{path}: not valid YAML: nested too deeply"):
        load_params(path)


@pytest.mark.parametrize("value", ["sk-proj-abcDEF123456", "OPENAI KEY", "1KEY", ""])
def test_an_api_key_written_where_its_variables_name_goes_is_refused_without_echoing_it(value):
    """judge.api_key_env names the variable; the key itself written there was accepted, then logged to MLflow as the
    param judge.api_key_env (and recorded in dvc.lock), and sent no key."""
    r = raw()
    r["judge"]["api_key_env"] = value
    with pytest.raises(ParamsError) as e:
        parse_params(r)
    assert str(e.value).startswith("params.yaml: judge.api_key_env: expected the name of an environment variable")
    assert value not in str(e.value).removeprefix("params.yaml: judge.api_key_env") or not value
    r["judge"]["api_key_env"] = "OPENAI_API_KEY"
    parse_params(r)


def test_a_misspelt_key_or_file_gets_a_suggestion_and_a_short_line(tmp_path, monkeypatch):
    """A misspelt section printed its whole contents in the line and no suggestion; a misspelt file name at the
    repository root was told to run from the repository root."""
    raw = yaml.safe_load(Path("params.yaml").read_text())
    raw["warmpu"] = raw.pop("warmup")
    raw["rlhf"]["budgte"] = 0.1
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    lines = str(err.value).splitlines()
    (section,) = [line for line in lines if line.startswith("params.yaml: warmpu:")]
    assert section.endswith("did you mean 'warmup'?") and len(section) < 160
    assert "params.yaml: rlhf.budgte: unknown key (got 0.1); did you mean 'budget'?" in lines
    with pytest.raises(ParamsError, match=r"^configs/params.smok.yaml: no such file; did you mean "
                                          r"configs/params.smoke.yaml\?$"):
        load_params("configs/params.smok.yaml")
    monkeypatch.chdir(tmp_path)  # away from the repository: the hint says where to run
    with pytest.raises(ParamsError, match=r"no such file \(run from the repository root\)"):
        load_params("params.yaml")
