"""Example DDP training programs (toy, image classifier, all_reduce bench) and their job files."""
