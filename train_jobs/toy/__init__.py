"""A small real DDP program used to test launching, argument passing and failure handling."""
