"""Multi-turn rollouts: the policy talks to a batch of environments through the token buffer."""
