"""Validate before anything exists: every static check of a recipe, through the real CLI.

Each bad recipe gets one line (file:line, field, what was expected, a did-you-mean) and exit code 2
from `cloudtrain validate`; `run` must refuse the same recipes before a run directory, a run row,
a credential call or an SSH key exists.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloudtrain.config import AwsConfig, Config
from cloudtrain.errors import NotAvailableError, RecipeError, UsageError
from cloudtrain.preflight import preflight, provider_traits, unsupported
from cloudtrain.recipe import Recipe, load_recipe
from tests.conftest import REPO, cloudtrain

AWS = "name: demo\nresources:\n  cloud: aws\n"  # lines 1-3
SSH = "name: demo\nresources: {cloud: ssh, hosts: [{address: 10.0.0.5}]}\nrun: x\n\n"  # lines 1-4


def aws(*resource_lines: str) -> str:
    return AWS + "".join(f"  {line}\n" for line in resource_lines) + "run: python train.py\n"


def job(*param_lines: str, cloud: str = "aws") -> str:
    # The param lines start at line 7.
    body = "".join(f"    {line}\n" for line in param_lines)
    return f"name: demo\nresources:\n  cloud: {cloud}\njob:\n  name: mnist_cnn\n  params:\n{body}"


def data(target: str) -> str:
    return f"name: demo\nrun: ls\ndata:\n  - source: .\n    target: {target}\n"


# (id, recipe text, fragments of the one line on stderr)
BAD = [
    # the plan, for priced clouds (aws): what the catalog knows, with did-you-mean
    ("instance-type-typo", aws("instance_type: g4dn.xlarg"),
     ["recipe.yaml:4: resources.instance_type", "aws instance type 'g4dn.xlarg' is not in the catalog cloudtrain knows", "did you mean 'g4dn.xlarge'?"]),
    ("region-typo", aws("region: us-est-1"), ["recipe.yaml:4: resources.region", "did you mean 'us-east-1'?"]),
    ("gpu-typo", aws("accelerators: T5:1"), ["recipe.yaml:4: resources.accelerators", "did you mean 'T4'?"]),
    ("gpu-unknown", aws("accelerators: Z9000"), ["recipe.yaml:4: resources.accelerators", "known GPUs: A10, A100"]),
    ("region-without-prices", aws("accelerators: T4:1", "region: ap-south-1"),
     ["recipe.yaml:5: resources.region", "catalog covers"]),
    ("too-many-gpus", aws("accelerators: H100:16"), ["recipe.yaml:4: resources.accelerators", "at most H100:8"]),
    ("type-and-gpu-disagree", aws("instance_type: g4dn.xlarge", "accelerators: A100:1"),
     ["recipe.yaml:5: resources.accelerators", "g4dn.xlarge has T4:1"]),
    ("type-too-small", aws("instance_type: t3.medium", "cpus: 8"), ["recipe.yaml:5: resources.cpus", "2 vCPUs"]),
    ("cpu-too-big", aws("cpus: 512"), ["recipe.yaml:4: resources.cpus", "no CPU offer with 512 vCPUs"]),
    ("type-not-in-region", aws("instance_type: p5.48xlarge", "region: eu-west-1"),
     ["recipe.yaml:4: resources.instance_type", "no offer of p5.48xlarge in eu-west-1"]),
    ("ami-without-region", aws("image: ami-0123456789abcdef0"), ["recipe.yaml:4: resources.image", "set resources.region"]),
    # `cloud: any` plans over every priced cloud, with the same checks
    ("cloud-any-gpu-typo", "name: demo\nresources: {cloud: any, accelerators: 'T5:1'}\nrun: x\n",
     ["recipe.yaml:2: resources.accelerators", "the catalog cloudtrain knows has no GPU called 'T5'", "did you mean"]),
    ("max-hourly-too-low", aws("accelerators: 'T4:1'", "max_hourly_usd: 0.01"),
     ["resources.max_hourly_usd", "nothing that fits costs $0.01/h or less"]),
    # fields the cloud cannot act on: autostop and budget where machines cannot stop themselves
    ("autostop", SSH + "autostop: {idle_minutes: 5}\n",
     ["recipe.yaml:5: autostop is not available for cloud ssh", "your own machines"]),
    ("budget", SSH + "budget: {max_hours: 5}\n", ["recipe.yaml:5: budget limits are not available for cloud ssh"]),
    ("budget-usd-on-free-cloud", "name: demo\nrun: x\nbudget: {max_usd: 5}\n",
     ["recipe.yaml:3: budget.max_usd needs a priced cloud", "budget.max_hours"]),
    ("region-on-local", "name: demo\nrun: x\nresources:\n  cloud: local\n  region: us-east-1\n",
     ["recipe.yaml:5: resources.region does not apply to cloud local"]),
    ("spot-on-local", "name: demo\nrun: x\nresources: {spot: true}\n",
     ["recipe.yaml:3: resources.spot does not apply to cloud local"]),
    # the bundled job's parameters
    ("param-typo", "name: demo\njob: {name: mnist_cnn, params: {epocs: 1}}\n",
     ["recipe.yaml:2: job.params.epocs", "mnist_cnn has no parameter 'epocs'", "did you mean 'epochs'?"]),
    ("param-unknown", job("optimizer: sgd"), ["recipe.yaml:7: job.params.optimizer", "mnist_cnn takes: data, epochs"]),
    ("epochs-negative", job("epochs: -3"), ["recipe.yaml:7: job.params.epochs", "must be >= 1, got -3"]),
    ("epochs-text", job('epochs: "ten"'), ["recipe.yaml:7: job.params.epochs", "expected a whole number, got 'ten'"]),
    ("epochs-fraction", job("epochs: 2.5"), ["job.params.epochs", "expected a whole number, got 2.5"]),
    ("batch-size-zero", job("batch_size: 0"), ["recipe.yaml:7: job.params.batch_size", "must be >= 1, got 0"]),
    ("batch-size-dashed", job("batch-size: -1"), ["recipe.yaml:7: job.params.batch-size", "must be >= 1"]),
    ("lr-zero", job("lr: 0"), ["job.params.lr", "must be > 0, got 0"]),
    ("lr-negative-text", job('lr: "-1e-3"'), ["job.params.lr", "must be > 0"]),
    ("lr-nan", job("lr: .nan"), ["job.params.lr", "expected a finite number"]),
    ("val-fraction-too-big", job("val_fraction: 0.7"), ["job.params.val_fraction", "must be > 0 and < 0.5, got 0.7"]),
    ("val-fraction-zero", job("val_fraction: 0"), ["job.params.val_fraction", "must be > 0"]),
    ("limit-train-zero", job("limit_train: 0"), ["job.params.limit_train", "must be >= 1"]),
    ("limit-test-negative", job("limit_test: -5"), ["job.params.limit_test", "must be >= 1"]),
    ("max-steps-zero", job("max_steps_per_epoch: 0"), ["job.params.max_steps_per_epoch", "must be >= 1"]),
    ("progress-every-zero", job("progress_every: 0"), ["job.params.progress_every", "must be >= 1"]),
    ("cpu-devices-zero", job("cpu_devices: 0"), ["job.params.cpu_devices", "must be >= 1"]),
    ("seed-negative", job("seed: -1"), ["job.params.seed", "must be >= 0"]),
    ("device-choice", job("device: tpu"),
     ["recipe.yaml:7: job.params.device", "expected one of auto, cpu, gpu, got 'tpu'", "did you mean 'gpu'?"]),
    ("yaml-on-is-a-boolean", job("mixed_precision: on"), ["job.params.mixed_precision", "got true", "quote the value"]),
    ("switch-not-bool", job("force: yes please"), ["job.params.force", "expected true or false"]),
    ("output-is-cloudtrains", job("output: /tmp/elsewhere"), ["recipe.yaml:7: job.params.output", "set by cloudtrain"]),
    ("second-param-bad", job("epochs: 1", "strategy: horovod"),
     ["recipe.yaml:8: job.params.strategy", "expected one of auto, default, mirrored, multiworker"]),
    ("param-on-local", job("epochs: 0", cloud="local"), ["recipe.yaml:7: job.params.epochs", "must be >= 1"]),
    # data targets live in the workdir on the node
    ("data-target-absolute", data("/etc/x"), ["recipe.yaml:5: data.0.target", "relative to the workdir", "'/etc/x'"]),
    ("data-target-dotdot", data("../x"), ["recipe.yaml:5: data.0.target", "without '..'"]),
    ("data-target-inner-dotdot", data("a/../../x"), ["data.0.target", "without '..'"]),
    ("data-target-home", data("~/x"), ["data.0.target", "'~/x'"]),
]


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS credentials, no instance metadata, every AWS endpoint a closed port: nothing can
    reach a cloud, so a command that got as far as a credential call fails fast and here."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, fragments: list[str]) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


# One recipe: its one line is the command's error. One case per kind of check (catalog, cloud
# field, job parameter, data target); every case is checked below, all in one process.
ONE = ["instance-type-typo", "autostop", "param-typo", "data-target-absolute"]


@pytest.mark.parametrize(("text", "fragments"), [(t, f) for i, t, f in BAD if i in ONE], ids=ONE)
def test_validate_refuses_with_one_line(tmp_path: Path, offline: None, text: str, fragments: list[str]) -> None:
    write(tmp_path, text)
    proc = cloudtrain("validate", "recipe.yaml", cwd=tmp_path)
    assert_one_line_exit_2(proc, fragments)


def test_validate_of_many_recipes_says_one_line_for_each_refused_one(tmp_path: Path, offline: None) -> None:
    # Every bad case, each in a directory of its own, and a good recipe among them: one line per
    # refused recipe (its own), the good one ok, exit 2.
    for case, text, _ in BAD:
        (tmp_path / case).mkdir()
        write(tmp_path / case, text)
    (tmp_path / "good").mkdir()
    write(tmp_path / "good", "name: demo\nrun: echo hi\n")
    paths = [f"{case}/recipe.yaml" for case, _, _ in BAD]
    proc = cloudtrain("validate", *paths[:5], "good/recipe.yaml", *paths[5:], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "good/recipe.yaml: ok (demo:" in proc.stdout
    assert f"{len(BAD)} of {len(BAD) + 1} recipes refused" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(BAD), proc.stderr
    for (case, _, fragments), line in zip(BAD, lines):
        assert line.startswith(f"error: {case}/recipe.yaml"), (case, line)
        for fragment in fragments:
            assert fragment in line, f"{case}: {fragment!r} not in {line!r}"


# `run` refuses through the same preflight as `validate` (whose line every BAD case checks above):
# here, that nothing exists afterwards, once per kind of check (catalog and plan, the cloud's
# fields, the job's parameters, data targets), not once per case (two CLI processes each).
RUN_CASES = ["instance-type-typo", "cloud-any-gpu-typo", "max-hourly-too-low", "autostop", "region-on-local",
             "param-typo", "param-on-local", "data-target-home"]


@pytest.mark.parametrize(("text", "fragments"), [(t, f) for i, t, f in BAD if i in RUN_CASES], ids=RUN_CASES)
def test_run_refuses_before_anything_exists(
    tmp_path: Path, offline: None, cloudtrain_home: Path, text: str, fragments: list[str]
) -> None:
    write(tmp_path, text)
    runs = tmp_path / "runs"
    proc = cloudtrain("run", "recipe.yaml", "--runs-dir", str(runs), cwd=tmp_path, timeout=120)
    assert_one_line_exit_2(proc, fragments)
    assert not runs.exists() or not any(runs.iterdir()), "a run directory was created"
    assert not (cloudtrain_home / "keys").exists(), "an SSH key was created"
    state = json.loads(cloudtrain("status", "--json").stdout)
    assert state == {"clusters": [], "runs": []}


UP_CASES = ["instance-type-typo", "cloud-any-gpu-typo", "max-hourly-too-low", "autostop", "epochs-negative",
            "data-target-absolute"]


@pytest.mark.parametrize(("text", "fragments"), [(t, f) for i, t, f in BAD if i in UP_CASES], ids=UP_CASES)
def test_up_refuses_before_anything_exists(
    tmp_path: Path, offline: None, cloudtrain_home: Path, text: str, fragments: list[str]
) -> None:
    write(tmp_path, text)
    proc = cloudtrain("up", "recipe.yaml", cwd=tmp_path, timeout=120)
    assert_one_line_exit_2(proc, fragments)
    assert not (cloudtrain_home / "keys").exists(), "an SSH key was created"
    assert json.loads(cloudtrain("status", "--json").stdout) == {"clusters": [], "runs": []}


# Recipes that must keep validating, with the plan line for priced clouds (None: no plan line).
GOOD = [
    ("aws-cpu", aws(), "plan: t3.medium in aws/us-east-1 at $0.0416/h"),
    ("aws-t4", aws("accelerators: T4:1"), "plan: g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h"),
    ("aws-two-nodes", AWS + "  instance_type: g4dn.xlarge\nnum_nodes: 2\nrun: x\n",
     "plan: 2 x g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h = $1.052/h"),
    ("aws-gpu-any-case", aws("accelerators: t4", "region: eu-west-1"), "g4dn.xlarge (T4:1) in aws/eu-west-1"),
    ("params-all-kinds", job('epochs: "3"', "batch-size: 64", "lr: 1e-3", "val_fraction: 0.2", "device: cpu",
                             "mixed_precision: 'off'", "data: bundled", "force: true", "no_placement_log: false",
                             "limit_train: 640", "seed: 7"), "plan: t3.medium"),
    ("params-from-env", job("epochs: ${CT_TEST_EPOCHS:-2}", "data: ${CT_TEST_DATA:-auto}", cloud="local"), None),
    ("local-run", "name: demo\nrun: echo hi\n", None),
    ("data-relative-targets", "name: demo\nrun: ls\ndata:\n  - {source: ., target: data}\n  - {source: ., target: ./a/b/}\n",
     None),
    ("ssh-hosts", "name: demo\nrun: x\nresources: {cloud: ssh, hosts: [{address: 10.0.0.5}]}\n", None),
]


def test_good_recipes_validate(tmp_path: Path, offline: None) -> None:
    # All in one process: each recipe's "ok" line, then its plan line for priced clouds only.
    for case, text, _ in GOOD:
        (tmp_path / case).mkdir()
        write(tmp_path / case, text)
    proc = cloudtrain("validate", *(f"{case}/recipe.yaml" for case, _, _ in GOOD), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("/recipe.yaml: ok (")[1:]
    assert len(blocks) == len(GOOD), proc.stdout
    for (case, _, plan_line), block in zip(GOOD, blocks):
        assert block.startswith("demo:"), (case, block)
        if plan_line is None:
            assert "plan:" not in block, (case, block)
        else:
            assert plan_line in block, (case, block)


# Every bundled recipe, with the variables its comments mention.
SSH_ONE = {"CT_SSH_HOST": "10.0.0.5", "CT_SSH_USER": "ubuntu"}
SSH_TWO = {**SSH_ONE, "CT_SSH_HOST_2": "10.0.0.6", "CT_SSH_NODES": "2", "CT_MNIST_DATA": "bundled",
           "CT_SSH_PORT": "2222", "CT_SSH_KEY": "~/.ssh/id_ed25519"}
BUNDLED = [
    ("mnist-local.yaml", {}, None),
    ("mnist-ssh.yaml", SSH_ONE, None),
    ("mnist-ssh.yaml", SSH_TWO, None),
    ("mnist-slurm.yaml", {"CT_SLURM_LOGIN": "login.cluster.example", "CT_SLURM_NODES": "2"}, None),
    ("torchrun-ssh.yaml", SSH_ONE, None),
    ("mnist-aws-t4.yaml", {}, "plan: g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h"),
    ("mnist-aws-spot.yaml", {}, "plan: g4dn.xlarge (T4:1) spot in aws/us-east-2 at $0.1578/h"),
    ("mnist-aws-s3.yaml", {"MNIST_BUCKET": "my-data"}, "plan: g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h"),
    ("mnist-gcp-t4.yaml", {}, "plan: n1-standard-4+t4x1 (T4:1) in gcp/us-central1 at $0.54/h"),
    ("mnist-gcp-spot.yaml", {}, "plan: n1-standard-4+t4x1 (T4:1) spot in gcp/us-central1 at $0.15/h"),
    ("mnist-azure-t4.yaml", {}, "plan: Standard_NC4as_T4_v3 (T4:1) in azure/eastus at $0.526/h"),
    ("mnist-azure-spot.yaml", {}, "plan: Standard_NC4as_T4_v3 (T4:1) spot in azure/westus2 at $0.06159/h"),
]


def test_bundled_recipes_are_all_covered() -> None:
    # Sweep recipes are checked by `cloudtrain sweep validate` (tests/sweep/test_spec.py).
    recipes = {p.name for p in (REPO / "recipes").glob("*.yaml") if not p.name.startswith("sweep-")}
    assert {name for name, _, _ in BUNDLED} == recipes


@pytest.mark.parametrize(("name", "env", "plan_line"), BUNDLED, ids=[f"{n}-{len(e)}" for n, e, _ in BUNDLED])
def test_bundled_recipes_validate(
    monkeypatch: pytest.MonkeyPatch, offline: None, name: str, env: dict[str, str], plan_line: str | None
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    if "CT_SSH_KEY" in env:  # the key the comments name exists, as it must (validate reads it)
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        key = Path(env["CT_SSH_KEY"]).expanduser()
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    proc = cloudtrain("validate", str(REPO / "recipes" / name))
    assert proc.returncode == 0, proc.stderr
    assert ": ok (" in proc.stdout
    assert (plan_line in proc.stdout) if plan_line else ("plan:" not in proc.stdout), proc.stdout


def test_validate_plans_with_the_configured_region(tmp_path: Path, offline: None, cloudtrain_home: Path) -> None:
    cloudtrain_home.mkdir(parents=True, exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text("aws: {region: eu-west-1}\n")
    write(tmp_path, aws("accelerators: T4:1", "image: ami-0123456789abcdef0"))
    proc = cloudtrain("validate", "recipe.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "plan: g4dn.xlarge (T4:1) in aws/eu-west-1 at $0.587/h" in proc.stdout


def test_validate_creates_nothing(tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home-that-must-not-appear"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(tmp_path / "no-config.yaml"))
    work = tmp_path / "work"
    work.mkdir()
    write(work, job("epochs: 1", cloud="aws").replace("  cloud: aws\n", "  cloud: aws\n  accelerators: T4:1\n"))
    proc = cloudtrain("validate", "recipe.yaml", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert not home.exists()
    assert sorted(p.name for p in work.iterdir()) == ["recipe.yaml"]


# In-process: the function the run/up pipeline calls.


def test_preflight_returns_the_plan_only_for_priced_clouds(tmp_path: Path) -> None:
    plan = preflight(load_recipe(write(tmp_path, aws("accelerators: T4:1")), env={}), Config())
    assert plan is not None and plan.best.instance_type == "g4dn.xlarge" and plan.best.region == "us-east-1"
    assert preflight(load_recipe(write(tmp_path, "name: demo\nrun: x\n"), env={}), Config()) is None
    ssh = "name: demo\nrun: x\nresources: {cloud: ssh, hosts: [{address: 10.0.0.5}]}\n"
    assert preflight(load_recipe(write(tmp_path, ssh), env={}), Config()) is None


def test_preflight_breaks_price_ties_towards_the_configured_region(tmp_path: Path) -> None:
    loaded = load_recipe(write(tmp_path, aws("accelerators: T4:1")), env={})
    plan = preflight(loaded, Config(aws=AwsConfig(region="us-west-2")))
    assert plan is not None and plan.best.region == "us-west-2"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (aws("region: us-est-1"), UsageError),
        (aws("region: ap-south-1"), NotAvailableError),
        ("name: demo\nresources: {cloud: any, accelerators: 'T5:1'}\nrun: x\n", UsageError),
        (job("epochs: 0"), RecipeError),
        ("name: demo\nrun: x\nbudget: {max_usd: 1}\n", NotAvailableError),
    ],
)
def test_preflight_errors_are_usage_errors(tmp_path: Path, text: str, error: type) -> None:
    with pytest.raises(error) as caught:
        preflight(load_recipe(write(tmp_path, text), env={}), Config())
    assert caught.value.exit_code == 2
    assert caught.value.one_line().startswith(f"{tmp_path / 'recipe.yaml'}:")


def test_preflight_without_the_yaml_names_the_file_and_field(tmp_path: Path) -> None:
    loaded = load_recipe(write(tmp_path, job("epochs: 0")), env={}).model_copy(update={"node": None})
    with pytest.raises(RecipeError) as caught:
        preflight(loaded, Config())
    assert caught.value.one_line().startswith(f"{tmp_path / 'recipe.yaml'}: job.params.epochs: must be >= 1")


def test_preflight_asks_no_network_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cloudtrain_home: Path
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("preflight opened a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    recipe = write(tmp_path, job("epochs: 2").replace("  cloud: aws\n", "  cloud: aws\n  accelerators: T4:1\n"))
    before = sorted(tmp_path.rglob("*"))
    assert preflight(load_recipe(recipe, env={}), Config()) is not None
    assert sorted(tmp_path.rglob("*")) == before
    assert not cloudtrain_home.exists()


def test_preflight_imports_no_sdk_tensorflow_or_numpy(tmp_path: Path) -> None:
    recipe = write(tmp_path, job("epochs: 2").replace("  cloud: aws\n", "  cloud: aws\n  accelerators: T4:1\n"))
    code = textwrap.dedent(f"""\
        import sys
        from cloudtrain.config import Config
        from cloudtrain.preflight import preflight
        from cloudtrain.recipe import load_recipe
        assert preflight(load_recipe({str(recipe)!r}, env={{}}), Config()) is not None
        heavy = ("numpy", "tensorflow", "boto3", "botocore", "paramiko", "google", "azure")
        print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "resources,top",
    [
        ({"cloud": "aws"}, {"autostop": {"idle_minutes": 5}}),
        ({"cloud": "ssh", "hosts": [{"address": "a"}]}, {"budget": {"max_usd": 1}}),
        ({"cloud": "local", "zone": "z"}, {}),
        ({"cloud": "local", "disk_gb": 50}, {}),
        ({"cloud": "local", "spot": True}, {}),
        ({"cloud": "aws", "region": "us-east-1"}, {}),
    ],
)
def test_unsupported_says_what_lifecycle_refuses(resources: dict, top: dict) -> None:
    # lifecycle.refuse_unavailable (for library callers that skip preflight) says the same.
    from cloudtrain.cluster.lifecycle import refuse_unavailable

    recipe = Recipe.model_validate({"name": "p", "run": "x", "resources": resources, **top})
    problem = unsupported(recipe)
    if problem is None:
        refuse_unavailable(recipe)
        return
    with pytest.raises(NotAvailableError) as caught:
        refuse_unavailable(recipe)
    assert (caught.value.message, caught.value.hint) == problem[1:]


@pytest.mark.parametrize("cloud", ["local", "ssh", "aws"])
def test_traits_are_read_from_the_provider_class(cloud: str) -> None:
    from cloudtrain.providers import get_provider

    assert provider_traits(cloud) == get_provider(cloud, Config()).traits


def _unusable() -> list[str]:
    from cloudtrain.providers import KNOWN, available

    return [c for c in KNOWN if c not in available()] + ["any", "openstack"]


@pytest.mark.parametrize("cloud", _unusable())
def test_clouds_get_provider_refuses_are_refused(cloud: str) -> None:
    with pytest.raises(NotAvailableError, match="not available yet"):
        provider_traits(cloud)


@pytest.mark.parametrize(("content", "said"), [
    (None, "does not exist"),
    (b"\x00\x01 random bytes, no key", "is not a private SSH key"),
    (b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@host\n", "is a public key"),
])
def test_a_host_key_that_is_missing_or_not_a_private_key_is_said_at_validate(
        tmp_path: Path, content: bytes | None, said: str) -> None:
    """Issue 35.12: a missing key file passed `validate`; a non-key file failed at the first connect
    with the parser's `MalformedFraming`. Now: one line, the recipe's line, what was expected."""
    key = tmp_path / "the-key"
    if content is not None:
        key.write_bytes(content)
    write(tmp_path, textwrap.dedent(f"""\
        name: demo
        resources:
          cloud: ssh
          hosts:
            - address: 10.0.0.5
              key: {key}
        run: echo hi
    """))
    proc = cloudtrain("validate", "recipe.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: recipe.yaml:6: resources.hosts.0.key: ") and said in line, line
    assert "MalformedFraming" not in line


def test_validate_says_the_paths_and_the_plan_in_one_round(tmp_path: Path, offline: None) -> None:
    """Issue 35.12: a missing workdir, a missing data source and an instance type typo used to take
    three rounds of `validate`; now one, a line each, with its file:line."""
    write(tmp_path, textwrap.dedent("""\
        name: demo
        workdir: ./nonexistent-dir
        resources:
          cloud: aws
          instance_type: g4dn.xlarg
        run: python train.py
        data:
          - source: ./nothere
            target: data
    """))
    proc = cloudtrain("validate", "recipe.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("error: recipe.yaml:2: workdir: ") and "is not a directory" in lines[0]
    assert lines[1].startswith("error: recipe.yaml:8: data[0].source: ") and "does not exist" in lines[1]
    assert lines[2].startswith("error: recipe.yaml:5: resources.instance_type: ") and "g4dn.xlarg" in lines[2]
