"""Backends: each sees only the optimized loop IR and the buffer table."""
