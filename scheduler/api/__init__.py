"""The scheduler's API floor: gRPC handlers (RunService, WorkService, schedules, admin), the wire
decoding and validation of requests, conversion to and from the store's rows, authentication of
callers over the key repository, the redaction of sealed values in answers (shield), and metrics.

It stands on background/, store/, the scheduler's shared rules and security/; nothing below imports it.
"""
