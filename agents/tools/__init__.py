"""agents/tools package."""
