"""Operations on hosts outside a launch: free a port, list / stop / replay jobs, dump stacks."""
