"""The executor: claims fenced work from the scheduler over gRPC and drives one run's steps.

It holds no database credentials. worker.py claims runs into slots (main.py assembles the
process and supervises its tasks); driver.py and steps.py take one run through its steps:
ask a decider (deciders/), persist the decision as a checkpoint, then call a tool through
the ledger protocol (toolcalls.py: intent, send, result, or IN_DOUBT), with tools/ as the
adapters. reconciler.py settles in-doubt calls through their lookup contracts; sdk.py is
the code-first agent API; agents.py loads definitions; registration.py tells the scheduler
which agents this process serves.
"""
