"""pytest plugin (entry point ``pytest11``): fixtures for suites that drive the real runner."""
