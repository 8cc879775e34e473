"""`agentrt dev`: the whole runtime on one machine, with the after-sales demo.

services.py  child processes (start, health, stop in order by pid, SIGKILL and restart)
stack.py     what starts in which order, the chaos loop, --exit-when-done, shutdown
demo.py      the demo agent file, the runs submitted, what "done" means for each
watch.py     live figures: GetStats, the session's runs, a Kafka reader of the events topic
summary.py   the closing report (runs, tool requests per idempotency key, in-doubt runs, events)
"""
