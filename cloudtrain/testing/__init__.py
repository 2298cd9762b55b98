"""cloudtrain's public test kit: real sshd VMs, moto server, fake clouds. See plugin.py."""
