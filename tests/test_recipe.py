"""Recipe validation: every bad recipe gets one line naming the place and what was expected."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cloudtrain.errors import RecipeError
from cloudtrain.recipe import json_schema, load_recipe

pytestmark = pytest.mark.quick

OK_BASE = "name: demo\nrun: echo hi\n"

# (id, recipe text, substrings the one-line message must contain)
BAD = [
    ("empty-file", "", ["the file is empty"]),
    ("top-level-list", "- a\n- b\n", ["expected a mapping", "list"]),
    ("yaml-syntax", "name: demo\nrun: [echo\n", ["YAML syntax error", ":3:1"]),
    ("yaml-bad-indent", "name: demo\n  run: x\n", ["YAML syntax error", ":2:"]),
    ("unknown-top-key", OK_BASE + "nmae: x\n", ["nmae", "unknown key", ":3"]),
    ("did-you-mean-top", OK_BASE + "setpu: pip install x\n", ["did you mean 'setup'"]),
    ("unknown-resources-key", OK_BASE + "resources: {clod: aws}\n", ["resources.clod", "did you mean 'cloud'"]),
    ("unknown-cloud", OK_BASE + "resources:\n  cloud: awz\n", ["resources.cloud", "did you mean 'aws'", ":4"]),
    ("unknown-cloud-far", OK_BASE + "resources: {cloud: openstack}\n", ["resources.cloud", "expected one of"]),
    ("missing-name", "run: echo hi\n", ["name", "required field is missing"]),
    ("bad-name-upper", "name: Demo\nrun: x\n", ["name", "lowercase"]),
    ("bad-name-space", "name: my job\nrun: x\n", ["name", "lowercase"]),
    ("bad-name-type", "name: [a]\nrun: x\n", ["name", "valid string"]),
    ("no-entry-point", "name: demo\n", ["nothing to run"]),
    ("run-and-job", OK_BASE + "job: {name: mnist_cnn}\n", ["either 'run'", "not both"]),
    ("unknown-job", "name: demo\njob: {name: resnet}\n", ["job.name", "mnist_cnn"]),
    ("job-unknown-key", "name: demo\njob: {name: mnist_cnn, parms: {}}\n", ["job.parms", "did you mean 'params'"]),
    ("job-param-nested", "name: demo\njob: {name: mnist_cnn, params: {epochs: [1]}}\n", ["job.params.epochs"]),
    ("negative-nodes", OK_BASE + "num_nodes: -1\n", ["num_nodes", "greater than or equal to 1", "-1"]),
    ("zero-nodes", OK_BASE + "num_nodes: 0\n", ["num_nodes", "greater than or equal to 1"]),
    ("nodes-not-int", OK_BASE + "num_nodes: two\n", ["num_nodes", "valid integer"]),
    ("negative-cpus", OK_BASE + "resources: {cpus: -4}\n", ["resources.cpus", "greater than or equal to 1"]),
    ("negative-memory", OK_BASE + "resources: {memory: -1}\n", ["resources.memory", "greater than 0"]),
    ("tiny-disk", OK_BASE + "resources: {disk_gb: 2}\n", ["resources.disk_gb", "greater than or equal to 8"]),
    ("spot-not-bool", OK_BASE + "resources: {spot: maybe}\n", ["resources.spot", "valid boolean"]),
    ("bad-accelerators", OK_BASE + "resources: {accelerators: 'T4:x'}\n", ["resources.accelerators", "T4:1"]),
    ("zero-accelerators", OK_BASE + "resources: {accelerators: 'T4:0'}\n", ["resources.accelerators"]),
    ("zone-without-region", OK_BASE + "resources: {cloud: aws, zone: us-east-1a}\n", ["'zone' needs 'region'"]),
    ("hosts-on-aws", OK_BASE + "resources: {cloud: aws, hosts: [{address: a}]}\n", ["'hosts' only applies"]),
    ("ssh-without-hosts", OK_BASE + "resources: {cloud: ssh}\n", ["needs a 'hosts' list"]),
    ("ssh-host-bad-port", OK_BASE + "resources: {cloud: ssh, hosts: [{address: a, port: 70000}]}\n",
     ["resources.hosts.0.port", "less than or equal to 65535"]),
    ("ssh-host-unknown-key", OK_BASE + "resources: {cloud: ssh, hosts: [{adress: a}]}\n",
     ["resources.hosts.0.adress", "did you mean 'address'"]),
    ("too-few-hosts", OK_BASE + "num_nodes: 2\nresources: {cloud: ssh, hosts: [{address: a}]}\n",
     ["num_nodes is 2", "1 host"]),
    ("envs-list", OK_BASE + "envs: [A, B]\n", ["envs", "valid dictionary"]),
    ("envs-bad-name", OK_BASE + "envs: {'1X': y}\n", ["envs", "MY_VAR"]),
    ("envs-nested", OK_BASE + "envs: {A: {b: c}}\n", [":3: envs.A: must be a string, number or boolean, got dict"]),
    ("undefined-var", OK_BASE + "envs: {TOKEN: '${CT_TEST_UNDEFINED_VAR}'}\n",
     ["envs.TOKEN", "${CT_TEST_UNDEFINED_VAR} is not set", "export CT_TEST_UNDEFINED_VAR"]),
    ("undefined-var-nested", "name: demo\nrun: x\nresources: {region: '${CT_TEST_NOPE}'}\n",
     ["resources.region", "${CT_TEST_NOPE}"]),
    ("missing-workdir", OK_BASE + "workdir: ./does-not-exist\n", ["workdir", "is not a directory"]),
    ("missing-data-source", OK_BASE + "data: [{source: ./nope, target: data}]\n", ["data[0].source", "does not exist"]),
    ("data-missing-target", OK_BASE + "data: [{source: .}]\n", ["data.0.target", "required field is missing"]),
    ("results-absolute", OK_BASE + "results: [/etc]\n", ["results", "relative to the workdir"]),
    ("results-dotdot", OK_BASE + "results: [../x]\n", ["results", "without '..'"]),
    ("autostop-negative", OK_BASE + "autostop: {idle_minutes: -5}\n", ["autostop.idle_minutes"]),
    ("budget-negative", OK_BASE + "budget: {max_usd: -1}\n", ["budget.max_usd", "greater than 0"]),
    ("budget-unknown", OK_BASE + "budget: {maxusd: 5}\n", ["budget.maxusd", "did you mean 'max_usd'"]),
    # Duplicate keys: YAML would silently keep the last one, so the first `run` would never run.
    ("duplicate-top-key", "name: demo\nrun: echo first\nsetup: x\nrun: echo second\n",
     [":4: duplicate key 'run' (first at line 2)", "delete one"]),
    ("duplicate-nested-key", OK_BASE + "resources:\n  cloud: aws\n  region: us-east-1\n  cloud: local\n",
     [":6: resources: duplicate key 'cloud' (first at line 4)"]),
    ("duplicate-flow-key", OK_BASE + "envs: {A: '1', B: '2', A: '3'}\n", [":3: envs: duplicate key 'A' (first at line 3)"]),
    ("duplicate-in-list-item", OK_BASE + "resources:\n  cloud: ssh\n  hosts:\n    - address: a\n      port: 22\n"
     "      address: b\n", [":8: resources.hosts.0: duplicate key 'address' (first at line 6)"]),
    ("duplicate-same-value", "name: demo\nname: demo\nrun: x\n", [":2: duplicate key 'name' (first at line 1)"]),
    # Keys that differ in spelling but load as the same value are the same key to YAML.
    ("duplicate-after-resolving", OK_BASE + "envs:\n  1: a\n  0x1: b\n",
     [":5: envs: duplicate key '0x1' (first at line 4 as '1')"]),
    ("envs-nested-names-its-line", OK_BASE + "envs:\n  A: ok\n  B: [1]\n", [":5: envs.B", "string, number or boolean"]),
    ("no-doubled-got", OK_BASE + "num_nodes: 1.5\n",
     [("num_nodes: input should be a valid integer, got a number with a fractional part (1.5)")]),
    ("union-is-one-problem", "name: demo\njob: {name: mnist_cnn, params: {epochs: {a: 1}}}\n",
     [(":2: job.params.epochs: input should be a valid string, a valid integer, a valid number or a valid boolean, "
       "got dict")]),
    ("duplicate-bool-int", OK_BASE + "job: {name: mnist_cnn, params: {true: 1, 1: 2}}\n",
     ["job.params: duplicate key '1' (first at line 3 as 'true')"]),  # both load as the Python key True
    ("bad-date", OK_BASE + "envs: {BORN: 2024-13-45}\n", [":3:", "'2024-13-45'", "month must be in 1..12", "quote"]),
    ("duplicate-merge-key", ("base: &b {name: demo}\nmore: &m {run: x}\n"
                             "<<: *b\n<<: *m\n"), [":4: duplicate key '<<' (first at line 3)", "<<: [*a, *b]"]),
]


@pytest.mark.parametrize("text,expected", [(t, e) for _, t, e in BAD], ids=[i for i, _, _ in BAD])
def test_bad_recipe_one_clear_line(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, env={})
    line = info.value.one_line()
    assert "\n" not in line
    assert str(path) in line
    for fragment in expected:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    assert info.value.exit_code == 2
    assert line.count(" got ") <= 1, line


# Several problems: each on its own line with file:line, in file order, at most five (issue 14.10).
def test_several_problems_each_get_a_line_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("name: demo\nrun: x\nnum_nodes: 0\nresources:\n  cpus: -1\n  clod: aws\nsetpu: y\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, env={})
    assert info.value.message.splitlines() == [
        f"{path}:3: num_nodes: input should be greater than or equal to 1, got 0",
        f"{path}:5: resources.cpus: input should be greater than or equal to 1, got -1",
        f"{path}:6: resources.clod: unknown key 'clod'; did you mean 'cloud'?",
        f"{path}:7: setpu: unknown key 'setpu'; did you mean 'setup'?",
    ]


def test_at_most_five_problems_then_a_count(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(OK_BASE + "".join(f"extra{i}: 1\n" for i in range(8)))
    with pytest.raises(RecipeError) as info:
        load_recipe(path, env={})
    lines = info.value.message.splitlines()
    assert len(lines) == 5 and all(line.startswith(f"{path}:{i + 3}: extra{i}: unknown key") for i, line in enumerate(lines))
    assert lines[-1].endswith("(and 3 more problems)")


def test_a_misspelt_required_key_is_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("nmae: demo\nrun: x\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, env={})
    assert info.value.message == f"{path}:1: nmae: unknown key 'nmae'; did you mean 'name'?"


def test_duplicate_keys_are_all_listed_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("name: demo\nresources:\n  cloud: aws\n  cloud: local\nrun: x\nrun: y\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, env={})
    assert info.value.message.splitlines() == [
        f"{path}:4: resources: duplicate key 'cloud' (first at line 3)",
        f"{path}:6: duplicate key 'run' (first at line 5)",
    ]
    assert info.value.hint and "delete one" in info.value.hint


def test_undefined_variable_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("name: demo\nrun: x\ndata:\n  - source: .\n    target: '${CT_TEST_NOPE}'\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, env={})
    assert info.value.message == f"{path}:5: data[0].target: ${{CT_TEST_NOPE}} is not set in the environment"


def test_merge_keys_still_work_and_may_be_overridden(tmp_path: Path) -> None:
    # `<<` copies keys from an anchor; a key written next to it overrides the merged one on purpose,
    # which is not a duplicate (nor is the same key coming from two merged mappings).
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "name: demo\n"
        "num_nodes: 3\n"
        "run: echo hi\n"
        "resources:\n"
        "  cloud: ssh\n"
        "  hosts:\n"
        "    - &host {address: a, user: ubuntu, port: 2222}\n"
        "    - <<: *host\n"
        "      address: b\n"
        "    - <<: [{address: c, port: 1}, *host]\n"
        "      user: root\n"
    )
    hosts = load_recipe(path, env={}).recipe.resources.hosts
    assert [(h.address, h.user, h.port) for h in hosts] == [("a", "ubuntu", 2222), ("b", "ubuntu", 2222), ("c", "root", 1)]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="file not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_interpolation_and_defaults(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent("""\
        name: demo
        workdir: ${CODE_DIR}
        envs: {LR: "${LR:-0.01}", EPOCHS: 3, FLAG: true}
        run: echo ${LEFT_FOR_THE_NODE_SHELL}
    """))
    loaded = load_recipe(path, env={"CODE_DIR": str(tmp_path / "code")})
    assert loaded.workdir == (tmp_path / "code").resolve()
    assert loaded.recipe.envs == {"LR": "0.01", "EPOCHS": "3", "FLAG": "true"}
    # run/setup are shell for the node: ${...} there is not ours to expand.
    assert loaded.recipe.run == "echo ${LEFT_FOR_THE_NODE_SHELL}"


def test_accelerators_parsed(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("name: demo\nrun: x\nresources: {cloud: aws, accelerators: 'V100:8'}\n")
    res = load_recipe(path).recipe.resources
    assert (res.accelerator_name, res.accelerator_count) == ("V100", 8)


def test_bundled_job_collects_outputs(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("name: demo\njob: {name: mnist_cnn, params: {epochs: 1}}\nresults: [extra]\n")
    assert load_recipe(path).recipe.result_paths() == ["extra", "outputs"]


def test_every_bundled_recipe_validates() -> None:
    root = Path(__file__).resolve().parents[1] / "recipes"
    env = {"CT_SSH_HOST": "127.0.0.1", "CT_SSH_PORT": "22", "CT_SSH_USER": "u", "CT_SSH_KEY": "/k",
           "CT_SSH_HOST2": "127.0.0.1", "CT_SSH_PORT2": "22", "CT_SLURM_LOGIN": "127.0.0.1"}
    recipes = sorted(root.glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        # Sweep recipes are a base recipe plus `sweep:`, checked by `cloudtrain sweep validate`.
        load_recipe(recipe, env=env, sweep=recipe.name.startswith("sweep-"))


def test_schema_is_json_schema() -> None:
    schema = json_schema()
    assert schema["title"] == "cloudtrain recipe"
    assert {"name", "resources", "run", "job", "budget", "autostop"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
    # Failover keeps the GPU count asked for unless the recipe opts in (plan.make_plan).
    resources = schema["$defs"]["Resources"]["properties"]
    assert resources["allow_more_accelerators"]["type"] == "boolean"
    assert resources["allow_more_accelerators"]["default"] is False


def test_schema_matches_what_validation_accepts(tmp_path: Path) -> None:
    """Editors use the schema: it must not flag what cloudtrain accepts (`EPOCHS: 3`), and should flag
    what cloudtrain refuses (bad names, accelerators, env names) (issue 14.12)."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())

    def schema_ok(doc: dict) -> bool:
        return validator.is_valid(doc)

    def cloudtrain_ok(doc: dict) -> bool:
        import yaml

        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump(doc))
        try:
            load_recipe(path, env={})
        except RecipeError:
            return False
        return True

    base = {"name": "demo", "run": "x"}
    accepted = [{"envs": {"EPOCHS": 3, "LR": 0.01, "DEBUG": True, "NAME": "x"}},
                {"resources": {"cloud": "aws", "accelerators": "T4:1"}}, {"resources": {"accelerators": "V100"}},
                {"resources": {"cloud": "aws", "accelerators": "T4:1", "allow_more_accelerators": True}},
                {"name": "a"}, {"name": "my-job-2"}]
    refused = [{"name": "My_Job"}, {"name": "-x"}, {"name": "x-"}, {"name": "a" * 41},
               {"resources": {"accelerators": "T4:0"}}, {"resources": {"accelerators": "T4:x"}},
               {"envs": {"1X": "y"}}, {"envs": {"A": [1]}}, {"envs": {"A": None}},
               {"resources": {"cloud": "aws", "allow_more_accelerators": "yes"}}]
    for extra in accepted:
        doc = {**base, **extra}
        assert cloudtrain_ok(doc) and schema_ok(doc), doc
    for extra in refused:
        doc = {**base, **extra}
        assert not cloudtrain_ok(doc) and not schema_ok(doc), doc
