"""annotation phase."""
