"""Pure-JAX environments (Sokoban, FrozenLake), their BFS solver and registry."""
