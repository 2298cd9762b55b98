"""Clusters: lifecycle (the only writer of cluster state), reaching nodes, and gc."""
