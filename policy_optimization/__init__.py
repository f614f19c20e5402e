"""policy_optimization phase."""
