"""Replicas on Ray Serve: the deployments and their builder, the prefix-affinity router and its table."""
