"""The one-fixture-per-cloud kit: zero settings, isolation, faults that mean what they say, links.

The CLI runs as a subprocess against the fixtures exactly as a user's test would; what we assert
about the cloud we read back from moto.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from cloudtrain.names import NAME_RE
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.cloud import LocalCloud, SshCloud
from cloudtrain.testing.tcpproxy import TcpProxy
from cloudtrain.testing.wait import wait_until
from tests.lazy import Lazy

botocore_errors = Lazy("botocore.exceptions")

# ------------------------------------------------------------------------------ TcpProxy


def _server() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    return server


def _passes(port: int, server: socket.socket) -> bool:
    """Does a new connection to `port` reach `server` and relay a byte?"""
    try:
        client = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return False
    with client:
        client.settimeout(2)
        try:
            client.sendall(b"x")
        except OSError:
            return False
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                peer, _ = server.accept()
            except BlockingIOError:
                time.sleep(0.01)
                continue
            with peer:
                peer.settimeout(2)
                return peer.recv(1) == b"x"
        return False


def test_tcp_proxy_close_lets_no_new_connection_through() -> None:
    server = _server()
    proxy = TcpProxy(server.getsockname()[1])
    try:
        assert _passes(proxy.port, server)
        kept = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        time.sleep(0.1)
        proxy.close()
        # The connection that was open is cut ...
        kept.settimeout(2)
        try:
            assert kept.recv(10) == b""
        except ConnectionResetError:
            pass
        kept.close()
        # ... and not one new connection reaches the target (the old close() relayed one more).
        for _ in range(5):
            assert not _passes(proxy.port, server)
        with pytest.raises(BlockingIOError):
            while True:  # drain what the kept connection made, then nothing may be left
                peer, _ = server.accept()
                peer.close()
                assert proxy.connections == 2
        assert proxy.connections == 2
        proxy.close()  # twice is fine
    finally:
        server.close()


def test_tcp_proxy_down_keeps_the_link_down_until_up_or_for_a_while() -> None:
    server = _server()
    proxy = TcpProxy(server.getsockname()[1])
    try:
        proxy.down()
        assert proxy.is_down and not _passes(proxy.port, server) and not _passes(proxy.port, server)
        proxy.up()
        assert _passes(proxy.port, server)
        proxy.down(for_s=0.3)
        assert not _passes(proxy.port, server)
        time.sleep(0.5)
        assert not proxy.is_down and _passes(proxy.port, server)
        assert proxy.refused >= 3
    finally:
        proxy.close()
        server.close()


# ------------------------------------------------------------------------------ the fixtures' shape


def test_every_fixture_of_the_plugin_says_what_it_is(fake_cloud) -> None:  # noqa: ANN001
    import cloudtrain.testing.plugin as plugin

    fixtures = {name: obj for name, obj in vars(plugin).items()
                if type(obj).__name__ == "FixtureFunctionDefinition" or hasattr(obj, "_pytestfixturefunction")}
    assert {"local_cloud", "ssh_cloud", "aws_cloud", "fake_cloud", "moto_server", "moto_server_session",
            "sshd_vm", "sshd_vm_factory", "tcp_proxy"} <= fixtures.keys()
    undocumented = [name for name, obj in fixtures.items() if len((obj.__doc__ or "").strip()) < 40]
    assert undocumented == []
    with pytest.raises(LookupError, match="no fixture named nope_cloud"):
        fake_cloud("nope")


def test_each_cloud_sets_up_a_test_of_its_own(aws_cloud: AwsCloud) -> None:
    assert os.environ["HOME"] == str(aws_cloud.user_home) != pwd.getpwuid(os.getuid()).pw_dir
    assert os.environ["CLOUDTRAIN_HOME"] == str(aws_cloud.home)
    assert os.environ["AWS_ENDPOINT_URL_EC2"] == aws_cloud.server.url
    config = yaml.safe_load(aws_cloud.config_path.read_text())
    assert config["ssh"]["add_include"] is False and config["ssh"]["connect_retries_s"] <= 30
    assert config["ssh"]["allowed_cidr"] and "cloudtrain.testing.route" in config["ssh"]["proxy_command"]
    assert NAME_RE.fullmatch(aws_cloud.cluster) and aws_cloud.cluster.startswith("each-cloud-sets-up")
    assert aws_cloud.new_cluster() != aws_cloud.cluster
    aws_cloud.configure(ssh={"connect_retries_s": 5})
    config = yaml.safe_load(aws_cloud.config_path.read_text())
    assert config["ssh"]["connect_retries_s"] == 5 and config["ssh"]["add_include"] is False
    check = aws_cloud.cli("check", "aws")
    assert check.ok, check.output
    # A VM of your own can trust moto's key pairs of every region, as cloud-init would.
    assert "eu-west-1,us-east-1,us-east-2,us-west-2" in aws_cloud.server.authorized_keys_command(None)


def test_recipe_points_your_recipe_at_the_fake(
    local_cloud: LocalCloud, ssh_cloud: SshCloud, aws_cloud: AwsCloud, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    source = project / "train.yaml"
    source.write_text(yaml.safe_dump({
        "name": "mine", "num_nodes": 2, "workdir": ".", "data": [{"source": "data", "target": "data"}],
        "resources": {"cloud": "aws", "region": "eu-west-1", "instance_type": "g4dn.xlarge", "image": "ami-0123",
                      "spot": True},
        "envs": {"LR": "0.1"}, "run": "python3 train.py",
    }))
    aws = yaml.safe_load(aws_cloud.recipe(source).read_text())
    assert aws["name"] == aws_cloud.cluster
    # Same cloud: the machine is kept, the image (an AMI of the real account) is not.
    assert aws["resources"] == {"cloud": "aws", "region": "eu-west-1", "instance_type": "g4dn.xlarge", "spot": True}
    assert aws["workdir"] == str(project) and aws["data"][0]["source"] == str(project / "data")
    assert aws["run"] == "python3 train.py" and aws["num_nodes"] == 2

    ssh = yaml.safe_load(ssh_cloud.recipe(source, envs={"LR": "1"}).read_text())
    assert ssh["envs"] == {"LR": "1"}
    hosts = ssh["resources"]["hosts"]
    assert len(hosts) == 2 == len(ssh_cloud.vms)  # one VM per node, started on demand
    assert {h["port"] for h in hosts} == {vm.port for vm in ssh_cloud.vms}
    assert all(h["key"] == str(ssh_cloud.key) and h["user"] == ssh_cloud.vms[0].user for h in hosts)

    local = yaml.safe_load(local_cloud.recipe(source, name="other", num_nodes=1).read_text())
    assert local["resources"] == {"cloud": "local"} and local["name"] == "other"
    # Different clouds, different homes: nothing is shared between the fixtures' state.
    assert len({local_cloud.home, ssh_cloud.home, aws_cloud.home}) == 3


# ------------------------------------------------------------------------------ faults


def test_faults_say_what_status_they_send_and_whether_botocore_retries(aws_cloud: AwsCloud) -> None:
    assert aws_cloud.faults.add("InsufficientInstanceCapacity", times=0).http_status == 500  # as EC2 sends it
    assert aws_cloud.fail("quota", times=0).http_status == 400
    assert aws_cloud.fail("auth", times=0).http_status == 401
    assert aws_cloud.fail("capacity", retried=True, times=0).http_status == 500

    ec2 = aws_cloud.ec2()  # boto3's defaults: retries on
    launch = {"ImageId": aws_cloud.image(), "InstanceType": "t3.medium", "MinCount": 1, "MaxCount": 1}
    once = aws_cloud.fail("capacity", times=1)
    with pytest.raises(botocore_errors.ClientError, match="InsufficientInstanceCapacity"):
        ec2.run_instances(**launch)
    assert once.hits == 1 and aws_cloud.faults.count("RunInstances") == 1  # not retried

    momentary = aws_cloud.fail("capacity", times=1, retried=True)
    (inst,) = ec2.run_instances(**launch)["Instances"]  # botocore rode it out
    assert momentary.hits == 1 and aws_cloud.faults.count("RunInstances") == 3
    assert inst["InstanceId"] in aws_cloud.machines  # and the instance booted a VM


def test_auth_fault_is_one_line_and_creates_nothing(aws_cloud: AwsCloud) -> None:
    aws_cloud.fail("auth")
    up = aws_cloud.up(aws_cloud.recipe(run="echo hi"))
    assert up.returncode == 2, up.output
    errors = [line for line in up.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "AuthFailure" in errors[0], up.output
    assert aws_cloud.leftovers() == []
    check = aws_cloud.cli("check", "aws")  # STS refuses too
    assert check.returncode != 0 and "AuthFailure" in check.stdout + check.stderr, check.output


# ------------------------------------------------------------------------------ machines


def test_another_region_stop_and_start_need_no_settings(aws_cloud: AwsCloud) -> None:
    ssh_dir = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"
    before = sorted((p.name, p.stat().st_mtime) for p in ssh_dir.iterdir()) if ssh_dir.is_dir() else None
    # No quota in us-east-1: the plan's next region; its image and the key pair just work there.
    aws_cloud.fail("quota", regions={"us-east-1"})
    up = aws_cloud.up(aws_cloud.recipe(run="echo hi"))
    assert up.ok, up.output
    (inst,) = aws_cloud.instances(cluster=aws_cloud.cluster, states=["running"])
    assert inst["Placement"]["AvailabilityZone"].startswith(("us-east-2", "us-west-2"))
    vm = aws_cloud.machines.vm(inst["InstanceId"])

    wrote = aws_cloud.cli("exec", aws_cloud.cluster, "--", "sh", "-c", "echo kept > marker")
    assert wrote.ok, wrote.output
    assert aws_cloud.cli("stop", aws_cloud.cluster).ok
    assert not vm.running  # a stopped instance is a powered-off machine
    start = aws_cloud.cli("start", aws_cloud.cluster)
    assert start.ok, start.output
    (started,) = aws_cloud.instances(cluster=aws_cloud.cluster, states=["running"])
    assert started["PublicIpAddress"] != inst["PublicIpAddress"]  # moto gave it a new address ...
    read = aws_cloud.cli("exec", aws_cloud.cluster, "--", "cat", "marker")
    assert read.ok and "kept" in read.stdout, read.output  # ... which reaches the same machine

    assert aws_cloud.down().ok
    assert aws_cloud.leftovers() == []
    assert not vm.running
    assert not list(aws_cloud.user_home.rglob("*"))  # nothing written to HOME (no ~/.ssh/config)
    after = sorted((p.name, p.stat().st_mtime) for p in ssh_dir.iterdir()) if ssh_dir.is_dir() else None
    assert before == after  # nor to the real ~/.ssh


def test_local_cloud_teardown_ends_what_a_test_left_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = LocalCloud(tmp_path / "local", monkeypatch, hint="left")
    recipe = cloud.recipe(run="true")
    assert cloud.up(recipe).ok
    started = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "3127")
    assert started.ok, started.output
    assert _sleepers("3127")
    assert cloud.leftovers()
    cloud.close()
    assert cloud.leftovers() == []
    deadline = time.monotonic() + 10
    while _sleepers("3127") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sleepers("3127")


def _sleepers(arg: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and (proc / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", arg.encode()]
                    and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.append(int(proc.name))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ESRCH, errno.EACCES):
                raise
    return found


WATCHDOG_ROUTES = [  # (fixture, the variable that sends its watchdog's action to the fake, what it names)
    ("aws", "CLOUDTRAIN_WATCHDOG_SHUTDOWN", "ec2-shutdown"),  # was unset: `shutdown -h now` on the test machine
    ("gcp", "CLOUDTRAIN_WATCHDOG_SHUTDOWN", "gce-shutdown"),
    ("gcp", "CLOUDTRAIN_WATCHDOG_METADATA_URL", "http://127.0.0.1:"),
    ("azure", "CLOUDTRAIN_WATCHDOG_METADATA_URL", "http://127.0.0.1:"),
]


@pytest.mark.parametrize("name,variable,names", WATCHDOG_ROUTES)
def test_every_fixture_routes_every_watchdog_action_to_its_fake(fake_cloud, name: str, variable: str,  # noqa: ANN001
                                                                names: str) -> None:
    if name != "aws":
        pytest.importorskip({"gcp": "google.cloud.compute_v1", "azure": "azure.mgmt.compute"}[name])
    cloud = fake_cloud(name)
    assert names in cloud.env.get(variable, ""), cloud.env
    assert os.environ.get(variable) == cloud.env[variable]  # the CLI the test runs sees it


def test_an_instance_the_fake_calls_terminated_is_one_whose_machine_is_off(aws_cloud: AwsCloud,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """EC2 says "terminated" of a machine that is off. moto says it at once; the VM is powered off
    after moto answered, so a test that saw the state could let a job finish on a terminated machine
    (CI: a sweep trial's job finished twice). Here powering off is made slow: whoever sees the state
    finds the machine off."""
    ec2 = aws_cloud.server.client("ec2", aws_cloud.region)  # through the front, as cloudtrain calls it
    (launched,) = ec2.run_instances(ImageId=aws_cloud.image(), MinCount=1, MaxCount=1,
                                    InstanceType="t3.medium")["Instances"]
    instance = launched["InstanceId"]
    assert aws_cloud.machines.vm(instance).running
    power_off, off = aws_cloud.machines.power_off, threading.Event()

    def slowly(instance_id: str) -> None:
        time.sleep(1.0)
        power_off(instance_id)
        off.set()

    monkeypatch.setattr(aws_cloud.machines, "power_off", slowly)
    terminating = threading.Thread(target=lambda: ec2.terminate_instances(InstanceIds=[instance]))
    terminating.start()
    try:
        wait_until(lambda: aws_cloud.instances(states=["terminated"]), 30, "the instance terminated")
        assert off.is_set() and not aws_cloud.machines.vm(instance).running
    finally:
        terminating.join(30)
