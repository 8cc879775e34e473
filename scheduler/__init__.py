"""The scheduler: sole writer of run state; serves RunService and WorkService."""
