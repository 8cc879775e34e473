"""The client-side library: the RunService client (runs), the exactly-once Kafka consumer
(consumer) and the event tail (event_tail). It imports no service."""
