"""agentrt's common package: what two or more services use."""
