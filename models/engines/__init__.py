"""models/engines package."""
