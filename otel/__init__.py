"""otel package."""
