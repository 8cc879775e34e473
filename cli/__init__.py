"""The `agentrt` command (cli/main.py): run the services, operate them, and talk to a scheduler.

The production command line, shipped in the wheel and the container image. It stands on the
services and shared/ (each subcommand imports what it runs lazily); the dev stack (devstack/)
stands on it and adds `agentrt dev`, `mocktool`, `acceptance` and `chaos` when installed.
`python -m cli` is the same command from a checkout.
"""
