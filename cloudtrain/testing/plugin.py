"""pytest plugin (entry point `cloudtrain`): the test kit's fixtures, in any project, no conftest.

Installing cloudtrain with its `[dev]` extra registers it (docs/testing.md: how). One fixture per cloud, all with the same shape
(`FakeCloud`, cloudtrain/testing/cloud.py; user guide: docs/testing.md):
- local_cloud, ssh_cloud, aws_cloud: run your recipes with the real CLI against fakes, offline
- fake_cloud: `fake_cloud("aws")` -> the `aws_cloud` fixture's value, for parametrized tests
The parts they are made of, for tests of your own:
- sshd_vm, sshd_vm_factory: real OpenSSH sshd "VMs" on loopback (testing/sshd.py)
- tcp_proxy: a loopback TCP proxy that cuts connections or takes a link down (testing/tcpproxy.py)
- slurm_cluster: a real Slurm controller, two slurmd nodes and an sshd login node (testing/slurm.py)
- moto_server, moto_server_session: moto's EC2/SSM/STS server with fault injection (testing/aws.py)
- s3_buckets: S3 on moto with node identities enforced, role credentials from the metadata fake (testing/buckets.py)
- gcs_buckets: GCS (XML objects, JSON bucket IAM) with the fake GCE's identities enforced (testing/gcs.py)
- azure_blobs: Azurite with the fake ARM's Storage Blob Data roles enforced by a front (testing/blob.py)
- metadata_server: instance metadata fakes (GCE, Azure IMDS, EC2 role credentials; testing/metadata.py)
- ssh_persist_off (autouse), no_mux_left: no SSH connection kept after a command, unless asked (testing/mux.py)
- postgres_server, state_backend: a real PostgreSQL of the session; a test run on SQLite and on it (testing/postgres.py)

One import line per module, fixtures listed by name: a cloud's fake adds its own line.
"""

from cloudtrain.testing.aws import aws_cloud, moto_server, moto_server_session  # noqa: F401
from cloudtrain.testing.azure import arm_server, azure_cloud  # noqa: F401
from cloudtrain.testing.gcp import gce_server, gcp_cloud  # noqa: F401
from cloudtrain.testing.cloud import fake_cloud, local_cloud, ssh_cloud  # noqa: F401
from cloudtrain.testing.sshd import sshd_vm, sshd_vm_factory  # noqa: F401
from cloudtrain.testing.slurm import slurm_cluster  # noqa: F401
from cloudtrain.testing.tcpproxy import tcp_proxy  # noqa: F401
from cloudtrain.testing.buckets import s3_buckets  # noqa: F401
from cloudtrain.testing.gcs import gcs_buckets  # noqa: F401
from cloudtrain.testing.metadata import metadata_server  # noqa: F401
from cloudtrain.testing.blob import azure_blobs  # noqa: F401
from cloudtrain.testing.mux import no_mux_left, ssh_persist_off  # noqa: F401
from cloudtrain.testing.postgres import postgres_server, state_backend  # noqa: F401


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The CLI fork server (testing/forkcli.py) ends with the session that started it, before
    anything checks what the tests left running."""
    from cloudtrain.testing import forkcli

    forkcli.stop_server()

