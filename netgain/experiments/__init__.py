"""Experiments built from serve + load + report: compare, drill and profile."""
