"""Everything that touches a node: transports (local, SSH), sync, the detached-job runtime."""
