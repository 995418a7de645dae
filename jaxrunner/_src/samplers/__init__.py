"""Samplers: a backend plus the compiled policy step, turned into trajectories."""
