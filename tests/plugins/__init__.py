"""Plug-ins: the registries, loading, the contract suites and third-party packages."""
