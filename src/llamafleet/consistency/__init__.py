"""``llamafleet consistency``: run the same prompts through several configurations and compare the answers."""
