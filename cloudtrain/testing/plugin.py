"""pytest plugin (entry point `cloudtrain`): exposes the test kit's fixtures to any project.

`pip install cloudtrain[dev]` makes these available without a conftest:
- sshd_vm, sshd_vm_factory: real OpenSSH sshd "VMs" on loopback (testing/sshd.py)
- tcp_proxy: a loopback TCP proxy that can cut connections (testing/tcpproxy.py)
- moto_server, moto_server_session: moto's EC2/SSM server with fault injection (testing/aws.py)
"""

from cloudtrain.testing.aws import moto_server, moto_server_session
from cloudtrain.testing.sshd import sshd_vm, sshd_vm_factory
from cloudtrain.testing.tcpproxy import tcp_proxy

__all__ = ["moto_server", "moto_server_session", "sshd_vm", "sshd_vm_factory", "tcp_proxy"]
