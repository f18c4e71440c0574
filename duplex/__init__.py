"""The `duplex` command: a dispatcher above the packages whose commands it runs (duplex/cli.py)."""
