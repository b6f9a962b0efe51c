"""dispatcher package."""
