"""tests for problems/."""
