"""The vocabulary every layer speaks: trajectories, episodes, policies, returns, files."""
