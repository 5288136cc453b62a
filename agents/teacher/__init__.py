"""agents/teacher package."""
