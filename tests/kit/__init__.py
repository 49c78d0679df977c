"""Helpers shared by the test packages (importable because pytest puts tests/ on sys.path)."""
