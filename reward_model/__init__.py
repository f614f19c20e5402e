"""reward_model phase."""
