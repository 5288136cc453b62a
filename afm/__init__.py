"""afm-platform core: configuration, artifact storage, experiment tracking, local stack and the `afm` CLI."""
