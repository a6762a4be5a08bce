"""all_reduce bandwidth benchmark in the style of nccl-tests."""
